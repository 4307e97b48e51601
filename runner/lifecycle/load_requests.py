"""The bodies of the governed lifecycle calls, parsed strictly (pure): known fields, right
types and ranges, else 400 before governance spends a token (`runner/lifecycle/loads.py` runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.engines.kinds import LoadParams
from runner.errors import BadRequest

QUANTIZATIONS = ("awq-4bit", "gptq-4bit", "fp16", "bf16")
LOAD_FIELDS = frozenset(
    {
        "modelId",
        "quantization",
        "maxContextLength",
        "gpuMemoryBudgetMB",
        "evictModel",
        "verifiedOpToken",
    }
)
UNLOAD_FIELDS = frozenset({"modelId", "verifiedOpToken", "mode"})


@dataclass(frozen=True, slots=True)
class LoadRequest:
    model_id: str
    quantization: str | None
    max_context_length: int | None
    gpu_memory_budget_mb: int | None
    evict_model: str | None

    def params(self) -> LoadParams:
        """What the load asks its engine's start for, beyond the model's spec."""
        return LoadParams(self.max_context_length, self.quantization, self.gpu_memory_budget_mb)


def _opt_int(doc: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer from {low} to {high}")
    return value


def parse_load(doc: dict[str, Any]) -> LoadRequest:
    """The seed's load body, strictly: known fields, right types and ranges (400 otherwise)."""
    unknown = set(doc) - LOAD_FIELDS
    if unknown:
        raise BadRequest(f"unknown field(s) in load request: {', '.join(sorted(unknown))}")
    model_id = doc.get("modelId")
    if not isinstance(model_id, str) or not model_id:
        raise BadRequest("modelId is required and must be a non-empty string")
    quantization = doc.get("quantization")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise BadRequest(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    evict = doc.get("evictModel")
    if evict is not None and (not isinstance(evict, str) or not evict):
        raise BadRequest("evictModel must be a non-empty string")
    return LoadRequest(
        model_id,
        quantization,
        _opt_int(doc, "maxContextLength", 1, 10_000_000),
        _opt_int(doc, "gpuMemoryBudgetMB", 1, 100_000_000),
        evict,
    )
