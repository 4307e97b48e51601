"""How much memory a model will take before it is loaded: the estimate chain (seed 000).

Pure: no I/O. The caller sums the model's files with `runner/memory/files.py`.
Once the engine is up, the measured footprint replaces the estimate; these
rules only decide whether a load may start and what to evict for it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

BYTES_PER_MIB = 1024 * 1024

FileKind = Literal["gguf", "safetensors"]
EstimateSource = Literal["gpuMemoryBudgetMB", "vram_mb", "file_size", "name", "default"]

FILE_FACTORS: dict[FileKind, float] = {"gguf": 1.1, "safetensors": 1.3}
"""Weights on disk -> memory once loaded: GGUF adds KV cache and compute buffers;
safetensors adds those plus the framework's (PyTorch) allocator slack."""

DEFAULT_ESTIMATE_MB = 8192
"""When nothing is known: enough for a 7-8B model at 4-6 bits with its cache."""

NAME_OVERHEAD_FACTOR = 1.2
NAME_FIXED_OVERHEAD_MB = 512
"""The name rule's weights x 1.2 (KV cache, activations) + 512 MB (CUDA context)."""

UNQUANTIZED_BITS = 16.0
"""No quantization hint: 16-bit weights, as safetensors checkpoints ship (bf16/fp16)."""

# (pattern, bits per weight) in the order tried; the first that matches wins.
# GGUF k-quants carry scales, so their bits per weight sit above the nominal figure.
_B = r"(?<![a-z0-9])"  # start of a token
_QUANT_BITS: tuple[tuple[re.Pattern[str], float], ...] = tuple(
    (re.compile(pattern), bits)
    for pattern, bits in (
        (_B + r"(fp32|f32|float32)(?![a-z0-9])", 32.0),
        (_B + r"(fp16|f16|bf16|float16|bfloat16|half)(?![a-z0-9])", 16.0),
        (_B + r"i?q8(?!\d)", 8.5),
        (_B + r"(fp8|f8|int8|w8a8|w8a16|8-?bit)(?![a-z0-9])", 8.0),
        (_B + r"i?q6(?!\d)", 6.6),
        (_B + r"i?q5(?!\d)", 5.7),
        (_B + r"i?q4(?!\d)", 4.85),
        (_B + r"(awq|gptq|int4|nf4|fp4|w4a16|4-?bit)(?![a-z0-9])", 4.5),
        (_B + r"i?q3(?!\d)", 3.9),
        (_B + r"i?q2(?!\d)", 3.0),
    )
)
# "8x7b" (mixture of experts: every expert is resident), then "7b", "1.5b", "270m".
_EXPERTS = re.compile(r"(?<![a-z0-9.])(\d+)x(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")
_PARAMS = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")
_SCALE = {"b": 1e9, "m": 1e6}


@dataclass(frozen=True, slots=True)
class Estimate:
    """The expected footprint in MiB, the rule that gave it, and how it was reached."""

    mb: int
    source: EstimateSource
    detail: str


def estimate_mb(
    *,
    budget_mb: int | None,
    vram_mb: int | None,
    file_size_bytes: int | None,
    file_kind: FileKind | None,
    name: str,
    quantization: str | None = None,
    default_mb: int = DEFAULT_ESTIMATE_MB,
) -> Estimate:
    """The estimate chain; the first rule that has its input fires.

    - budget_mb: the load request's `gpuMemoryBudgetMB`.
    - vram_mb: the models file's `vram_mb`.
    - file_size_bytes, file_kind: the weights on disk (`files.model_files`).
    - name: the model id or repo id; quantization: the request's or catalog's.

    1. `gpuMemoryBudgetMB` given → it, as the caller asked.
    2. `vram_mb` given → it, as the operator configured.
    3. Weights on disk of a known kind → size x 1.1 (GGUF) or x 1.3 (safetensors).
    4. A parameter count in the name → params x bits per weight (from `quantization`,
       else a hint in the name, else 16) x 1.2 + 512 MB.
    5. Otherwise → `default_mb`.
    Explicit figures below 1 MB are refused (ValueError): the caller validates input.
    """
    for label, value in (("gpuMemoryBudgetMB", budget_mb), ("vram_mb", vram_mb)):
        if value is not None and value < 1:
            raise ValueError(f"{label} must be at least 1 MB, not {value}")
    # 1. the request's budget
    if budget_mb is not None:
        return Estimate(budget_mb, "gpuMemoryBudgetMB", "the request's gpuMemoryBudgetMB")
    # 2. the models file
    if vram_mb is not None:
        return Estimate(vram_mb, "vram_mb", "the models file's vram_mb")
    # 3. file size
    if file_size_bytes and file_kind is not None:
        factor = FILE_FACTORS[file_kind]
        mb = math.ceil(file_size_bytes * factor / BYTES_PER_MIB)
        return Estimate(mb, "file_size", f"{file_kind} weights {file_size_bytes} bytes x {factor}")
    # 4. the name
    guess = estimate_from_name(name, quantization)
    if guess is not None:
        return guess
    # 5. nothing known
    return Estimate(default_mb, "default", f"nothing known about {name!r}")


def params_from_name(name: str) -> float | None:
    """The parameter count a name states ("8x7b", "70B", "1.5b", "270m"); the largest
    when it states several (a context length such as "1m" is smaller than the model)."""
    text = name.lower()
    counts = [int(n) * float(size) * _SCALE[unit] for n, size, unit in _EXPERTS.findall(text)]
    counts += [float(size) * _SCALE[unit] for size, unit in _PARAMS.findall(text)]
    return max(counts) if counts else None


def bits_per_weight(hint: str) -> float | None:
    """Bits per weight from a quantization hint ("q4_k_m", "awq", "bf16"); None if none."""
    text = hint.lower()
    for pattern, bits in _QUANT_BITS:
        if pattern.search(text):
            return bits
    return None


def estimate_from_name(name: str, quantization: str | None = None) -> Estimate | None:
    """Rule 4 alone: None when the name states no parameter count.

    1. Parameter count from the name; none → None.
    2. Bits per weight from `quantization`, else from the name, else 16.
    3. params x bits / 8 bytes, x 1.2, + 512 MB, rounded up to whole MiB.
    """
    # 1. parameters
    params = params_from_name(name)
    if params is None:
        return None
    # 2. bits per weight
    bits = None
    if quantization:
        bits = bits_per_weight(quantization)
    if bits is None:
        bits = bits_per_weight(name)
    if bits is None:
        bits = UNQUANTIZED_BITS
    # 3. bytes, overhead
    weights_mb = params * bits / 8 / BYTES_PER_MIB
    mb = math.ceil(weights_mb * NAME_OVERHEAD_FACTOR + NAME_FIXED_OVERHEAD_MB)
    return Estimate(mb, "name", f"{params / 1e9:g}B params x {bits:g} bits, from {name!r}")
