"""Why memory could not be measured or accounted.

Exception tree::

    QuorumError (faults)                    status, code, type, extra, headers
    └── MemoryAccountingError        503    memory_accounting_error (base, never raised)
        ├── TelemetryUnavailable     503    telemetry_unavailable: NVML failed mid-run
        │   └── MeasurementUnavailable 503  measurement_unavailable: NVML lists the
        │                                   process but cannot say what it uses
        ├── LeaseStoreUnavailable    503    lease_store_unavailable: Redis unreachable
        └── LeaseLost                503    lease_lost: a renewal found the lease expired

Foreign errors are translated in one place each: `pynvml.NVMLError` in
`runner/memory/nvml.py` (`_nvml_errors`), redis-py's errors in
`runner/memory/leases.py` (`_redis_errors`). A placement that does not fit is
data (`placement.NoFit`), not an exception: the load task reports its reason.
"""

from __future__ import annotations

from faults import QuorumError

MemoryAccountingError = QuorumError.row("MemoryAccountingError", "memory_accounting_error", 503)
TelemetryUnavailable = MemoryAccountingError.row("TelemetryUnavailable", "telemetry_unavailable")
MeasurementUnavailable = TelemetryUnavailable.row(
    "MeasurementUnavailable", "measurement_unavailable"
)
"""NVML lists one of the processes but reports its memory as not available (Windows WDDM,
some containers): the caller keeps its estimate."""
LeaseStoreUnavailable = MemoryAccountingError.row(
    "LeaseStoreUnavailable", "lease_store_unavailable"
)
LeaseLost = MemoryAccountingError.row(
    "LeaseLost", "lease_lost", None, "memory lease of {holder!r} expired or was released"
)
"""A renewal found no lease (expired, or released): the holder acquires again, after
checking that its memory still fits."""
