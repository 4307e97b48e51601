"""What the runner says to llama-server and reads back from it, as pure functions.

- How it is started (`command_line`): the model file, `--ctx-size`, `--parallel` = the
  model's slots, `--n-gpu-layers`, `--flash-attn`, `--metrics`, `--slots`, `--embeddings`
  when asked, `--host 127.0.0.1`, a free port, a random per-process key read from a file
  only the runner's user can read (`--api-key-file`, never `--api-key` on the command
  line, which every local user reads): llama-server then answers every route but
  `/health` and `/v1/health` with 401 without it (seen on build 11434: `/slots`,
  `/slots/{id}?action=erase`, `/props`, `/metrics`, `/models`, the completions routes),
  so no other local process and no request a tenant makes the runner send can use the
  engine; and the flags that close its shared caches:
  `--cache-ram 0` (no host-memory prompt cache shared by every request),
  `--slot-prompt-similarity 0` (no similarity slot choice) and a private `--slot-save-path`
  (without it slot erase answers 501); `--alias` the model id, so answers name the model
  the client asked for, not the operator's file path; the model's LoRA adapters, each
  `--lora` (links in the engine's private folder, named by position: the index a
  request's `lora` list names), with `--lora-init-without-apply`.
- What a request may carry (`strip_client_cache_fields`): client-sent `id_slot`,
  `slot_id`, `cache_prompt`, `n_cache_reuse` and `lora` (an adapter chosen by the client)
  are removed; `n` > 1 is refused (it takes arbitrary slots). What the runner adds
  (`adapters/bodies.with_fields`): `id_slot`, `return_progress`, `lora`.
- What a streamed answer's first chunk reports (`report_from_progress`): the prompt tokens
  taken from the cache, before the headers leave, and the prompt's length in tokens (what
  a stream cut short before its usage is charged for its prompt); the progress events the
  client did not ask for are taken out (`strip_progress`).
- What a slot is compared by (`prompt_prefix`): the start of the prompt as text.

Facts: `docs/engines.md`, from llama.cpp `tools/server`. The engine itself (slots, erase,
save/restore, flush): `adapters/llama_server/engine.py`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from adapters.base import CacheReport
from adapters.errors import UnsupportedRequest
from adapters.llama_server.slots import PREFIX_CHARS

LLAMA_READY_MARKER = b"listening on http"
"""llama-server prints `... listening on http://HOST:PORT` once it serves (this build)."""

_CLIENT_CACHE_FIELDS = ("id_slot", "slot_id", "cache_prompt", "n_cache_reuse", "lora")


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """What one llama-server process is started with."""

    binary: str
    model_path: str
    port: int
    api_key_file: str  # holds the per-process key (mode 0600, in the runner's own folder)
    slots: int
    slot_save_path: str
    ctx_size: int | None = None
    n_gpu_layers: int | None = None
    flash_attn: str | None = None  # "on" | "off" | "auto"
    embeddings: bool = False
    pooling: str | None = None
    tensor_split: str | None = None  # shares per visible GPU when a model is split
    swa_full: bool = True  # full-size sliding-window cache: prefix reuse works after restore
    alias: str | None = None  # the model name answers carry (else the GGUF's path)
    lora_paths: tuple[str, ...] = ()  # adapters, in the order requests name them
    extra_args: tuple[str, ...] = ()


def command_line(opts: LaunchOptions) -> list[str]:
    """The exact argv for `opts` (pure)."""
    argv = [
        opts.binary,
        "-m",
        opts.model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(opts.port),
        "--api-key-file",
        opts.api_key_file,
        "--parallel",
        str(opts.slots),
        "--metrics",
        "--slots",
        "--cache-ram",
        "0",
        "--slot-prompt-similarity",
        "0",
        "--slot-save-path",
        opts.slot_save_path,
    ]
    if opts.ctx_size is not None:
        # llama-server splits --ctx-size across slots; give each slot the model's context.
        argv += ["--ctx-size", str(opts.ctx_size * opts.slots)]
    if opts.n_gpu_layers is not None:
        argv += ["--n-gpu-layers", str(opts.n_gpu_layers)]
    if opts.flash_attn is not None:
        argv += ["--flash-attn", opts.flash_attn]
    if opts.embeddings:
        argv.append("--embeddings")
    if opts.pooling is not None:
        argv += ["--pooling", opts.pooling]
    if opts.tensor_split is not None:
        argv += ["--tensor-split", opts.tensor_split]
    if opts.swa_full:
        argv.append("--swa-full")
    if opts.alias is not None:
        argv += ["--alias", opts.alias]
    for path in opts.lora_paths:
        argv += ["--lora", path]
    if opts.lora_paths:
        argv.append("--lora-init-without-apply")
    argv += list(opts.extra_args)
    return argv


KV_NEUTRAL_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--api-key-file",
        "--slot-save-path",
        "--alias",
        "--lora",
        "--parallel",
    }
)
"""Flags (each with its value) that do not change what a saved slot state holds: left
out of `kv_flags`. `--parallel` is one of them: a state restores into any slot."""


def kv_flags(argv: list[str]) -> list[str]:
    """The command line's flags that shape the KV cache a saved state holds (the model
    path and binary are keyed by digest instead): what the prefix cache folder is keyed by
    beside them (`prefix_store.folder_key`). `--ctx-size` counts per slot (the total is
    the slots' sum), so a change of `--parallel` keeps the states."""
    parallel = int(argv[argv.index("--parallel") + 1]) if "--parallel" in argv else 1
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv[1:], start=1):
        if skip:
            skip = False
            continue
        if arg in KV_NEUTRAL_FLAGS or arg == "-m":
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        if arg == "--lora-init-without-apply":
            continue
        if arg == "--ctx-size" and i + 1 < len(argv) and argv[i + 1].isdigit():
            out += [arg, str(int(argv[i + 1]) // max(1, parallel))]
            skip = True
            continue
        out.append(arg)
    return out


def new_api_key() -> str:
    """A random per-process key; hex, so it never starts with "-" (a flag, to a parser)."""
    return secrets.token_hex(24)


def prompt_prefix(obj: dict[str, Any]) -> str:
    """The start of a request's prompt as text, to compare with what each slot holds."""
    messages = obj.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            parts.append(f"{m.get('role')}\x00{text}\x01")
            size += len(parts[-1])
            if size >= PREFIX_CHARS:
                break
        return "".join(parts)[:PREFIX_CHARS]
    for key in ("prompt", "input"):
        value = obj.get(key)
        if isinstance(value, str):
            return value[:PREFIX_CHARS]
        if value is not None:
            return orjson.dumps(value).decode()[:PREFIX_CHARS]
    return ""


def strip_client_cache_fields(body: dict[str, Any]) -> bool:
    """Remove the fields that let a client pick a slot, a cache or an adapter; refuse
    `n` > 1."""
    n = body.get("n")
    if n is not None and n != 1:
        raise UnsupportedRequest(
            "n > 1 is not supported: each choice would take an engine slot of its own"
        )
    changed = False
    for key in _CLIENT_CACHE_FIELDS:
        if key in body:
            del body[key]
            changed = True
    return changed


def strip_progress(chunk: bytes) -> bytes:
    """Take the `prompt_progress` events the client did not ask for out of a stream: they
    carry no content (llama-server sends its own role chunk after them), so the client
    sees exactly the chunks it would without `return_progress`."""
    events = chunk.split(b"\n\n")
    return b"\n\n".join(e for e in events if b'"prompt_progress"' not in e)


def report_from_progress(chunk: bytes) -> CacheReport | None:
    """The cache report carried by a stream's first chunk (`prompt_progress`), if any:
    the cached tokens, the time so far and, as `input_tokens`, the prompt's `total`."""
    for line in chunk.split(b"\n"):
        if not line.startswith(b"data: {") or b"prompt_progress" not in line:
            continue
        try:
            parsed = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        progress = parsed.get("prompt_progress") if isinstance(parsed, dict) else None
        if isinstance(progress, dict):
            cached, total = progress.get("cache"), progress.get("total")
            ms = progress.get("time_ms")
            n = cached if isinstance(cached, int) and cached > 0 else 0
            prompt = total if isinstance(total, int) and total > 0 else 0
            gpu = round(ms) if isinstance(ms, int | float) and ms > 0 else 0
            return CacheReport(n > 0, n, gpu, prompt)
    return None
