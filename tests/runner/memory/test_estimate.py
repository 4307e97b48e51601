"""The estimate chain: which rule fires, and what the name heuristic reads."""

from __future__ import annotations

import pytest

from runner.memory import estimate_mb
from runner.memory.estimate import (
    DEFAULT_ESTIMATE_MB,
    bits_per_weight,
    estimate_from_name,
    params_from_name,
)

GIB = 1024**3


def _chain(**overrides: object) -> tuple[int, str]:
    args: dict[str, object] = {
        "budget_mb": None,
        "vram_mb": None,
        "file_size_bytes": None,
        "file_kind": None,
        "name": "mystery-model",
    }
    args.update(overrides)
    estimate = estimate_mb(**args)  # type: ignore[arg-type]
    return estimate.mb, estimate.source


def test_estimate_budget_wins_over_everything() -> None:
    """gpuMemoryBudgetMB is taken as given, before vram_mb, files and name."""
    assert _chain(
        budget_mb=9000, vram_mb=12000, file_size_bytes=GIB, file_kind="gguf", name="llama-7b"
    ) == (9000, "gpuMemoryBudgetMB")


def test_estimate_vram_mb_before_files() -> None:
    """vram_mb from the models file comes before the weights on disk."""
    assert _chain(vram_mb=12000, file_size_bytes=GIB, file_kind="gguf") == (12000, "vram_mb")


def test_estimate_gguf_file_size_times_1_1() -> None:
    """A GGUF file of 10 GiB is estimated at 11 GiB."""
    assert _chain(file_size_bytes=10 * GIB, file_kind="gguf") == (11264, "file_size")


def test_estimate_safetensors_file_size_times_1_3() -> None:
    """Safetensors weights of 10 GiB are estimated at 13 GiB."""
    assert _chain(file_size_bytes=10 * GIB, file_kind="safetensors") == (13312, "file_size")


def test_estimate_file_size_rounds_up() -> None:
    """A few bytes still count as one MiB."""
    assert _chain(file_size_bytes=10, file_kind="gguf") == (1, "file_size")


def test_estimate_unknown_file_kind_falls_to_name() -> None:
    """Files of no known kind (or none at all) leave the estimate to the name."""
    assert _chain(file_size_bytes=GIB, file_kind=None, name="qwen2.5-7b-q4_k_m")[1] == "name"
    assert _chain(file_size_bytes=0, file_kind="gguf", name="qwen2.5-7b-q4_k_m")[1] == "name"


def test_estimate_default_when_nothing_is_known() -> None:
    """No figure, no files, no parameter count in the name: the default."""
    assert _chain(name="phi-mystery") == (DEFAULT_ESTIMATE_MB, "default")
    estimate = estimate_mb(
        budget_mb=None,
        vram_mb=None,
        file_size_bytes=None,
        file_kind=None,
        name="x",
        default_mb=1234,
    )
    assert (estimate.mb, estimate.source) == (1234, "default")


@pytest.mark.parametrize("field", ["budget_mb", "vram_mb"])
def test_estimate_refuses_non_positive_figures(field: str) -> None:
    """An explicit figure under 1 MB is a caller's bug, refused loudly."""
    with pytest.raises(ValueError, match="at least 1 MB"):
        _chain(**{field: 0})


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8e9),
        ("Meta-Llama-3-70B-Instruct-AWQ", 70e9),
        ("google/gemma-3-270m-it", 0.27e9),
        ("Qwen/Qwen2.5-1.5B-Instruct", 1.5e9),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 56e9),
        ("Qwen/Qwen3-30B-A3B", 30e9),
        ("Qwen2.5-7B-Instruct-1M", 7e9),
        ("HuggingFaceTB/SmolLM2-135M", 0.135e9),
        ("mistral-7b-instruct-v0.2.Q4_K_M.gguf", 7e9),
        ("BAAI/bge-m3", None),
        ("microsoft/phi-4", None),
        ("neuralmagic/model-FP8-e4m3", None),
    ],
)
def test_estimate_params_from_name(name: str, params: float | None) -> None:
    """Parameter counts are read from common model names; version numbers are not."""
    found = params_from_name(name)
    assert found == (pytest.approx(params) if params is not None else None)


@pytest.mark.parametrize(
    ("hint", "bits"),
    [
        ("Q4_K_M", 4.85),
        ("iq4_xs", 4.85),
        ("q8_0", 8.5),
        ("Q5_K_S", 5.7),
        ("q6_k", 6.6),
        ("Q3_K_L", 3.9),
        ("q2_k", 3.0),
        ("AWQ", 4.5),
        ("gptq-int4", 4.5),
        ("bnb-4bit", 4.5),
        ("int8", 8.0),
        ("FP8", 8.0),
        ("bf16", 16.0),
        ("fp16", 16.0),
        ("f32", 32.0),
        ("q4f16_1", 4.85),
        ("instruct", None),
    ],
)
def test_estimate_bits_per_weight_from_hint(hint: str, bits: float | None) -> None:
    """Quantization hints map to bits per weight, k-quants with their scales."""
    assert bits_per_weight(hint) == bits


def test_estimate_name_rule_arithmetic() -> None:
    """7B at q4 (4.85 bits): weights x 1.2 + 512 MB."""
    estimate = estimate_from_name("mistral-7b-instruct.Q4_K_M")
    assert estimate is not None
    weights_mb = 7e9 * 4.85 / 8 / (1024 * 1024)
    assert estimate.mb == pytest.approx(weights_mb * 1.2 + 512, abs=1)
    assert estimate.source == "name"


def test_estimate_name_without_hint_assumes_16_bits() -> None:
    """A name with a size but no quantization is taken as 16-bit weights."""
    unquantized = estimate_from_name("llama-3.1-8b-instruct")
    half = estimate_from_name("llama-3.1-8b-instruct-bf16")
    assert unquantized is not None and half is not None
    assert unquantized.mb == half.mb
    assert 18000 < unquantized.mb < 19500


def test_estimate_quantization_argument_beats_the_name() -> None:
    """The request's quantization overrides a hint in the name."""
    by_name = estimate_mb(
        budget_mb=None, vram_mb=None, file_size_bytes=None, file_kind=None, name="llama-70b-fp16"
    )
    by_argument = estimate_mb(
        budget_mb=None,
        vram_mb=None,
        file_size_bytes=None,
        file_kind=None,
        name="llama-70b-fp16",
        quantization="awq",
    )
    assert by_argument.mb < by_name.mb / 3


def test_estimate_larger_models_estimate_larger() -> None:
    """Within one quantization, more parameters never estimate less memory."""
    sizes = ["270m", "1.5b", "7b", "13b", "70b"]
    estimates = [estimate_from_name(f"model-{s}-q4_k_m") for s in sizes]
    figures = [e.mb for e in estimates if e is not None]
    assert figures == sorted(figures) and len(figures) == len(sizes)
