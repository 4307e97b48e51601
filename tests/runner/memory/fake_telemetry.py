"""`FakeTelemetry`: several GPUs whose figures a test sets by hand (the runner's
`runner.memory.telemetry.Telemetry` protocol, for tests that have no GPU to read)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runner.memory.telemetry import GpuInfo, TelemetrySnapshot


class FakeTelemetry:
    """GPUs 0..n-1 with the given totals; used memory, utilization and each pid's
    use are plain dicts the test writes. `fail` makes every call raise it."""

    def __init__(self, totals_mb: Sequence[int], name: str = "Fake GPU") -> None:
        self.totals_mb = list(totals_mb)
        self.name = name
        self.used_mb: dict[int, int] = {i: 0 for i in range(len(self.totals_mb))}
        self.utilization: dict[int, float | None] = {i: 0.0 for i in range(len(self.totals_mb))}
        self.process_mb: dict[int, int] = {}
        self.fail: Exception | None = None
        self.closed = False

    def use(self, index: int, used_mb: int) -> FakeTelemetry:
        """Set GPU `index`'s used memory; returns self so setups chain."""
        if not 0 <= used_mb <= self.totals_mb[index]:
            raise ValueError(f"GPU {index} holds {self.totals_mb[index]} MB, not {used_mb}")
        self.used_mb[index] = used_mb
        return self

    def snapshot(self) -> TelemetrySnapshot:
        if self.fail is not None:
            raise self.fail
        return TelemetrySnapshot(
            source="fake",
            gpus=tuple(
                GpuInfo(
                    index=i,
                    name=self.name,
                    total_mb=total,
                    used_mb=self.used_mb[i],
                    free_mb=total - self.used_mb[i],
                    utilization=self.utilization[i],
                )
                for i, total in enumerate(self.totals_mb)
            ),
        )

    def process_used_mb(self, pids: Iterable[int]) -> int:
        """The sum of `process_mb` for these pids (descendants are the test's to list)."""
        if self.fail is not None:
            raise self.fail
        return sum(self.process_mb.get(pid, 0) for pid in set(pids))

    def close(self) -> None:
        self.closed = True
