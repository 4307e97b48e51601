"""GPU memory: telemetry, the estimate chain, placement, leases and accounting.

How the pieces meet when a model loads::

    estimate_mb(...)                     how much it will need     (estimate.py, pure)
    telemetry.snapshot() + leases.all()  what the GPUs hold         (telemetry.py, leases.py)
    account(gpus, leases)                free per GPU               (accounting.py, pure)
    place(need, free_gpus(accounts))     which GPUs, how much each  (placement.py, pure)
    leases.acquire(holder, per_gpu_mb)   claim it in the state store
    telemetry.process_used_mb(pids)      measured, after the load: replaces the estimate
"""

from runner.memory.accounting import (
    GpuAccount,
    account,
    free_gpus,
    leased_per_gpu,
    overcommitted,
)
from runner.memory.errors import (
    LeaseLost,
    LeaseStoreUnavailable,
    MeasurementUnavailable,
    MemoryAccountingError,
    TelemetryUnavailable,
)
from runner.memory.estimate import Estimate, EstimateSource, FileKind, estimate_mb
from runner.memory.factory import telemetry_from_settings
from runner.memory.files import ModelFiles, model_files
from runner.memory.leases import Lease, LeaseStore, MemoryLeaseStore, RedisLeaseStore
from runner.memory.nvml import NvmlTelemetry, parse_visible_devices
from runner.memory.placement import (
    DEFAULT_MARGIN_MB,
    GpuFree,
    GpuPlacement,
    NoFit,
    cuda_visible_devices,
    place,
    tensor_split,
)
from runner.memory.telemetry import BudgetTelemetry, GpuInfo, Telemetry, TelemetrySnapshot

__all__ = [
    "DEFAULT_MARGIN_MB",
    "BudgetTelemetry",
    "Estimate",
    "EstimateSource",
    "FileKind",
    "GpuAccount",
    "GpuFree",
    "GpuInfo",
    "GpuPlacement",
    "Lease",
    "LeaseLost",
    "LeaseStore",
    "LeaseStoreUnavailable",
    "MeasurementUnavailable",
    "MemoryAccountingError",
    "MemoryLeaseStore",
    "ModelFiles",
    "NoFit",
    "NvmlTelemetry",
    "RedisLeaseStore",
    "Telemetry",
    "TelemetrySnapshot",
    "TelemetryUnavailable",
    "account",
    "cuda_visible_devices",
    "estimate_mb",
    "free_gpus",
    "leased_per_gpu",
    "model_files",
    "overcommitted",
    "parse_visible_devices",
    "place",
    "telemetry_from_settings",
    "tensor_split",
]
