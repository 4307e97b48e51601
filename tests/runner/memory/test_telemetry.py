"""Budget telemetry, /proc process trees, the fake, and the factory's choice."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.memory import BudgetTelemetry, NvmlTelemetry, telemetry_from_settings
from runner.memory.proc import (
    child_pids,
    mem_available_mb,
    parent_pids,
    process_tree,
    resident_kib,
    tree_from_table,
    tree_resident_mb,
)
from tests.runner.memory.fake_nvml import FakeNvml
from tests.runner.memory.fake_telemetry import FakeTelemetry

ALLOC_TREE = Path(__file__).with_name("alloc_tree.py")


@dataclass
class Tree:
    proc: subprocess.Popen[str]
    leaf_pid: int

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"


@pytest.fixture
def tree() -> Iterator[Tree]:
    proc = subprocess.Popen(
        [sys.executable, str(ALLOC_TREE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield Tree(proc, int(proc.stdout.readline()))
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_budget_snapshot_is_one_device_of_the_budget() -> None:
    """Without a GPU there is one device, index 0, total = budget, used = accounted leases."""
    used = [3000]
    telemetry = BudgetTelemetry(16000, lambda: used[0])
    snap = telemetry.snapshot()
    assert snap.source == "budget"
    (gpu,) = snap.gpus
    assert (gpu.index, gpu.total_mb, gpu.used_mb, gpu.free_mb) == (0, 16000, 3000, 13000)
    assert gpu.utilization is None
    used[0] = 5000
    assert telemetry.snapshot().gpu(0).free_mb == 11000


def test_budget_free_never_negative() -> None:
    """Leases above the budget read as 0 free, not a negative figure."""
    gpu = BudgetTelemetry(1000, lambda: 1500).snapshot().gpus[0]
    assert (gpu.used_mb, gpu.free_mb) == (1500, 0)


def test_budget_refuses_empty_budget() -> None:
    """A budget under 1 MB is a configuration error."""
    with pytest.raises(ValueError):
        BudgetTelemetry(0, lambda: 0)


def test_budget_measures_process_tree_resident_memory(tree: Tree) -> None:
    """The measured figure covers the process and its child, and grows as either allocates."""
    telemetry = BudgetTelemetry(100_000, lambda: 0)
    assert {tree.proc.pid, tree.leaf_pid} <= process_tree([tree.proc.pid])
    before = telemetry.process_used_mb([tree.proc.pid])
    tree.command("self")
    after_self = telemetry.process_used_mb([tree.proc.pid])
    assert after_self >= before + 40
    tree.command("leaf")
    after_leaf = telemetry.process_used_mb([tree.proc.pid])
    assert after_leaf >= after_self + 40
    assert telemetry.process_used_mb([tree.leaf_pid]) >= 40


def test_proc_parent_pids_include_this_process() -> None:
    """The /proc scan finds this test process under its real parent."""
    assert parent_pids()[os.getpid()] == os.getppid()


def test_proc_gone_process_counts_zero() -> None:
    """A pid that does not exist is its own tree and holds nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_tree([proc.pid]) == {proc.pid}
    assert resident_kib(proc.pid) == 0
    assert tree_resident_mb([proc.pid]) == 0


def _fake_proc(root: Path, pid: int, ppid: int, comm: str, status: str = "") -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    if status:
        (root / str(pid) / "status").write_text(status)


def test_proc_tree_parses_odd_process_names(tmp_path: Path) -> None:
    """A process name with spaces and parentheses does not confuse the parent pid."""
    _fake_proc(tmp_path, 10, 1, "engine")
    _fake_proc(tmp_path, 11, 10, "a) b (c")
    _fake_proc(tmp_path, 12, 11, "worker 1")
    _fake_proc(tmp_path, 13, 1, "other")
    assert process_tree([10], tmp_path) == {10, 11, 12}
    # no children files here: the table fallback gets the roots even from a one-shot iterator
    assert process_tree(iter([10]), tmp_path) == {10, 11, 12}


def test_proc_tree_walks_the_children_files(tmp_path: Path) -> None:
    """With /proc/<pid>/task/<tid>/children, the walk reads them (every thread's), not the
    stat of every process on the host: here the stat files name no parents at all."""
    for pid in (10, 11, 12, 13):
        _fake_proc(tmp_path, pid, 1, "p")
    for pid, tid, kids in ((10, 10, "11 "), (10, 20, "12"), (11, 11, ""), (12, 12, "")):
        (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / str(pid) / "task" / str(tid) / "children").write_text(kids)
    assert process_tree([10], tmp_path) == {10, 11, 12}


def test_proc_children_files_agree_with_the_process_table(tree: Tree) -> None:
    """On this machine's kernel the children walk finds what the full table scan finds."""
    root = tree.proc.pid
    assert child_pids(root) is not None  # the kernel offers the files (CONFIG_PROC_CHILDREN)
    assert process_tree([root]) == tree_from_table([root], Path("/proc"))
    assert tree.leaf_pid in process_tree([root])


def test_proc_sums_rss_over_the_tree(tmp_path: Path) -> None:
    """The resident figure of a tree is the VmRSS of each process, summed."""
    _fake_proc(tmp_path, 10, 1, "engine", "Name:\tengine\nVmRSS:\t  204800 kB\n")
    _fake_proc(tmp_path, 11, 10, "worker", "Name:\tworker\nVmRSS:\t  102400 kB\n")
    assert tree_resident_mb([10], tmp_path) == 300


def test_proc_counts_rss_not_pss(tmp_path: Path) -> None:
    """Pages shared with other processes (a model file others map too) count in full:
    RSS, not PSS, so another process mapping the same file cannot shrink the figure."""
    _fake_proc(tmp_path, 10, 1, "engine", "VmRSS:\t  204800 kB\n")
    (tmp_path / "10" / "smaps_rollup").write_text("Rss:  204800 kB\nPss:  51200 kB\n")
    assert tree_resident_mb([10], tmp_path) == 200


def test_proc_mem_available(tmp_path: Path) -> None:
    """MemAvailable is read in MiB; a meminfo without it is an error."""
    (tmp_path / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n")
    assert mem_available_mb(tmp_path / "meminfo") == 4096
    (tmp_path / "meminfo").write_text("MemTotal: 8388608 kB\n")
    with pytest.raises(OSError):
        mem_available_mb(tmp_path / "meminfo")


def test_proc_mem_available_of_this_machine() -> None:
    """This machine's MemAvailable is a positive figure."""
    assert mem_available_mb() > 0


def test_fake_telemetry_figures_are_the_tests() -> None:
    """The fake reports the GPUs, use and per-pid figures the test sets."""
    fake = FakeTelemetry([24576, 16384]).use(1, 4000)
    fake.process_mb[42] = 3000
    snap = fake.snapshot()
    assert [(g.index, g.total_mb, g.free_mb) for g in snap.gpus] == [
        (0, 24576, 24576),
        (1, 16384, 12384),
    ]
    assert fake.process_used_mb([42, 43]) == 3000
    with pytest.raises(ValueError):
        fake.use(0, 30000)


def test_factory_prefers_nvml_when_a_gpu_answers() -> None:
    """A GPU that answers gives NVML telemetry over the visible devices."""
    nvml = FakeNvml([24, 24])
    telemetry = telemetry_from_settings(4096, "1", measure=lambda: 0, nvml=nvml)
    assert isinstance(telemetry, NvmlTelemetry)
    assert [g.index for g in telemetry.snapshot().gpus] == [1]
    telemetry.close()


def test_factory_budget_when_no_device_is_visible() -> None:
    """CUDA_VISIBLE_DEVICES="" hides every GPU, so the budget applies."""
    telemetry = telemetry_from_settings(4096, "", measure=lambda: 0, nvml=FakeNvml([24]))
    assert isinstance(telemetry, BudgetTelemetry)
    assert telemetry.budget_mb == 4096


def test_factory_budget_without_nvml() -> None:
    """NVML failing to start gives the RUNNER_MEMORY_MB budget."""
    nvml = FakeNvml([24], init_fails=True)
    telemetry = telemetry_from_settings(4096, None, measure=lambda: 0, nvml=nvml)
    assert isinstance(telemetry, BudgetTelemetry)
    assert telemetry.snapshot().gpus[0].total_mb == 4096


def test_factory_default_budget_is_mem_available(tmp_path: Path) -> None:
    """RUNNER_MEMORY_MB unset: the budget is MemAvailable at start."""
    (tmp_path / "meminfo").write_text("MemAvailable: 2097152 kB\n")
    nvml = FakeNvml([], init_fails=False)
    telemetry = telemetry_from_settings(None, None, measure=lambda: 0, nvml=nvml, proc=tmp_path)
    assert isinstance(telemetry, BudgetTelemetry)
    assert telemetry.budget_mb == 2048


def test_factory_on_this_machine_is_a_budget() -> None:
    """Here (no GPU) the real factory falls back to the budget."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    telemetry = telemetry_from_settings(4096, None, measure=lambda: 0)
    assert isinstance(telemetry, BudgetTelemetry)


def test_factory_refuses_mig_devices() -> None:
    """A MIG instance in CUDA_VISIBLE_DEVICES is refused at start, naming the setting."""
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES"):
        telemetry_from_settings(4096, "MIG-abc", measure=lambda: 0, nvml=FakeNvml([24]))
