"""Why memory could not be measured or accounted.

Exception tree::

    RunnerError (runner/errors.py)          status, code, type, extra, headers
    └── MemoryAccountingError        503    memory_accounting_error (base, never raised)
        ├── TelemetryUnavailable     503    telemetry_unavailable: NVML failed mid-run
        │   └── MeasurementUnavailable 503  measurement_unavailable: NVML lists the
        │                                   process but cannot say what it uses
        ├── LeaseStoreUnavailable    503    lease_store_unavailable: Redis unreachable
        └── LeaseLost                503    lease_lost: a renewal found the lease expired

Foreign errors are translated in one place each: `pynvml.NVMLError` in
`runner/memory/nvml.py` (`_nvml_errors`), redis-py's errors in
`runner/memory/leases.py` (`_redis_errors`). Placement that does not fit is
data (`placement.NoFit`), not an exception: the load task reports its reason.
"""

from __future__ import annotations

from runner.errors import RunnerError


class MemoryAccountingError(RunnerError):
    """Base of the memory package's errors; 503, since each one is about a resource."""

    status = 503
    code = "memory_accounting_error"
    type = "server_error"


class TelemetryUnavailable(MemoryAccountingError):
    """NVML answered with an error while the runner was running (driver gone, GPU lost)."""

    code = "telemetry_unavailable"


class MeasurementUnavailable(TelemetryUnavailable):
    """NVML lists one of the processes but reports its memory as not available
    (Windows WDDM, some containers): the caller keeps its estimate."""

    code = "measurement_unavailable"


class LeaseStoreUnavailable(MemoryAccountingError):
    """The lease store (Redis) did not answer; loads are refused until it is back."""

    code = "lease_store_unavailable"


class LeaseLost(MemoryAccountingError):
    """A renewal found no lease: it expired (the holder was too slow) or was released.

    The holder must acquire again, after checking that its memory still fits.
    """

    code = "lease_lost"

    def __init__(self, holder: str) -> None:
        super().__init__(f"memory lease of {holder!r} expired or was released")
        self.holder = holder
