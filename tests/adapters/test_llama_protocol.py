"""adapters.llama_server.protocol: the llama-server command line, the request rewrite and the
first-chunk cache report, as pure functions (the real engine:
tests/runner/engines/test_llama_real.py)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from adapters.base import CacheReport
from adapters.errors import UnsupportedRequest
from adapters.llama_server.protocol import (
    LaunchOptions,
    command_line,
    kv_flags,
    new_api_key,
    prompt_prefix,
    report_from_progress,
    strip_client_cache_fields,
    strip_progress,
)
from adapters.llama_server.slots import PREFIX_CHARS

pytestmark = pytest.mark.timeout(10)

OPTS = LaunchOptions(
    binary="/bin/llama-server",
    model_path="/m/gemma.gguf",
    port=8123,
    api_key_file="/tmp/slots-1/.api-key",
    slots=2,
    slot_save_path="/tmp/slots-1",
)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_command_line_closes_the_shared_caches_and_binds_loopback_with_a_key() -> None:
    """llama-server starts with no shared RAM cache nor similarity slot choice, on
    loopback, with an API key read from a file (never on its command line)."""
    argv = command_line(OPTS)
    assert argv[:3] == ["/bin/llama-server", "-m", "/m/gemma.gguf"]
    assert _flag(argv, "--cache-ram") == "0"  # no host prompt cache shared by every request
    assert _flag(argv, "--slot-prompt-similarity") == "0"  # no similarity-based slot choice
    assert _flag(argv, "--slot-save-path") == "/tmp/slots-1"  # slot erase works
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8123")
    assert _flag(argv, "--api-key-file") == "/tmp/slots-1/.api-key"
    assert "--api-key" not in argv  # a key on the command line: every local user reads it
    assert _flag(argv, "--parallel") == "2"
    assert {"--metrics", "--slots", "--swa-full"} <= set(argv)
    assert "--alias" not in argv
    named = command_line(replace(OPTS, alias="org/gemma-3-270m"))
    assert _flag(named, "--alias") == "org/gemma-3-270m"  # answers name the model, not the file


def test_command_line_gives_each_slot_the_models_context_and_only_asked_flags() -> None:
    """Each slot gets the model's whole context; optional flags appear only when asked for."""
    plain = command_line(OPTS)
    for absent in ("--ctx-size", "--n-gpu-layers", "--flash-attn", "--embeddings", "--pooling"):
        assert absent not in plain
    full = command_line(
        replace(
            OPTS,
            slots=4,
            ctx_size=2048,
            n_gpu_layers=99,
            flash_attn="on",
            embeddings=True,
            pooling="mean",
            tensor_split="1,1",
            swa_full=False,
            extra_args=("--threads", "2"),
        )
    )
    assert _flag(full, "--ctx-size") == "8192"  # llama-server splits --ctx-size over slots
    assert (_flag(full, "--n-gpu-layers"), _flag(full, "--flash-attn")) == ("99", "on")
    assert "--embeddings" in full and _flag(full, "--pooling") == "mean"
    assert _flag(full, "--tensor-split") == "1,1"
    assert "--swa-full" not in full
    assert full[-2:] == ["--threads", "2"]  # the models file's own args come last


def test_api_keys_are_random_hex_never_read_as_a_flag() -> None:
    """API keys are random hex that cannot start with a dash."""
    keys = {new_api_key() for _ in range(20)}
    assert len(keys) == 20
    assert all(len(k) == 48 and int(k, 16) >= 0 and not k.startswith("-") for k in keys)


def test_client_cache_fields_are_removed_and_n_above_one_refused() -> None:
    """Client-sent slot and cache fields are removed; n above 1 is refused."""
    body = {"id_slot": 1, "slot_id": 0, "cache_prompt": True, "n_cache_reuse": 8, "n": 1}
    assert strip_client_cache_fields(body) is True
    assert body == {"n": 1}
    assert strip_client_cache_fields({"messages": []}) is False
    with pytest.raises(UnsupportedRequest, match="n > 1"):
        strip_client_cache_fields({"n": 2})


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj)


PROGRESS = {"choices": [{"delta": {"role": "assistant", "content": None}}]}


def test_first_chunk_reports_the_cached_prompt_tokens() -> None:
    """A stream's first chunk gives the prompt tokens served from the cache and the
    prompt's length (`total`: what a stream cut short is charged for its prompt)."""
    hit = _event({**PROGRESS, "prompt_progress": {"total": 300, "cache": 280, "time_ms": 0}})
    assert report_from_progress(hit + b"\n\n") == CacheReport(True, 280, 0, 300)
    miss = _event({**PROGRESS, "prompt_progress": {"total": 300, "cache": 0, "time_ms": 12.4}})
    assert report_from_progress(miss) == CacheReport(False, 0, 12, 300)
    assert report_from_progress(_event({"choices": []})) is None
    assert report_from_progress(b'data: {"prompt_progress": nope}') is None


def test_progress_events_are_taken_out_and_everything_else_kept_byte_for_byte() -> None:
    """Progress events are removed from a stream; every other byte is kept."""
    progress = _event({**PROGRESS, "prompt_progress": {"cache": 3}})
    content = _event({"choices": [{"delta": {"content": "Hi"}}]})
    chunk = progress + b"\n\n" + content + b"\n\n"
    assert strip_progress(chunk) == content + b"\n\n"
    assert strip_progress(content + b"\n\n") == content + b"\n\n"


def test_prompt_prefix_is_the_prompt_start_as_text_capped() -> None:
    """The prompt prefix used for slot choice is the prompt's start as text, capped."""
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    assert prompt_prefix(chat) == "system\x00S\x01user\x00U\x01"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    assert prompt_prefix(parts) == 'user\x00[{"type":"text","text":"x"}]\x01'
    assert prompt_prefix({"prompt": "p" * (PREFIX_CHARS + 10)}) == "p" * PREFIX_CHARS
    assert prompt_prefix({"input": ["a", "b"]}) == '["a","b"]'
    assert prompt_prefix({}) == ""


def test_adapters_are_loaded_unapplied_and_a_clients_lora_removed() -> None:
    """Adapters go on the command line in order, loaded without being applied; a client's
    own `lora` list is removed like the cache fields."""
    argv = command_line(replace(OPTS, lora_paths=("/s/lora-0.gguf", "/s/lora-1.gguf")))
    at = [i for i, a in enumerate(argv) if a == "--lora"]
    assert [argv[i + 1] for i in at] == ["/s/lora-0.gguf", "/s/lora-1.gguf"]
    assert "--lora-init-without-apply" in argv
    assert "--lora" not in command_line(OPTS)
    body = {"messages": [], "lora": [{"id": 0, "scale": 1.0}]}
    assert strip_client_cache_fields(body) and "lora" not in body


def test_kv_flags_leave_out_what_does_not_shape_a_saved_state() -> None:
    """The prefix cache folder is keyed by the flags that shape the KV cache: not the port,
    key, slot folder, alias, adapters or slot count (the model is keyed by its digest)."""
    one = command_line(replace(OPTS, ctx_size=512, alias="m", lora_paths=("/s/l.gguf",)))
    two = command_line(replace(OPTS, port=9, api_key_file="/k/.key", slot_save_path="/o", slots=4,
                               ctx_size=512))  # fmt: skip
    assert kv_flags(one) == kv_flags(two)
    assert "--swa-full" in kv_flags(one) and "512" not in " ".join(kv_flags(command_line(OPTS)))
    assert kv_flags(command_line(replace(OPTS, swa_full=False))) != kv_flags(command_line(OPTS))
