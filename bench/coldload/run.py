"""P9 (cold load through the runner ÷ by hand) and P10 (load-task eta vs actual), real engine.

    .venv/bin/python -m bench.coldload.run [--quick] [--reps 8] [--via auto|api|preload]

What it does, page cache warm (one untimed load of each kind first):
- api (when the runner has `POST /v1/models/load`): one runner (dev governance keys) serves
  the default models file's Gemma 3 270M entry (`models.yaml`: gemma-3-270m, llama-server;
  not the preloaded SmolLM2: the figures in docs/benchmarks.md are Gemma's) with
  `preload: false`. Each load: a governed POST /v1/models/load, then GET
  /v1/models/load/{taskId} every `--task-poll-ms` until `completed`; recorded: the task's
  `loadTimeMs`, the pool's own "ready in N ms" (spawn to healthy), the wall time the
  client saw (POST to the poll that read `completed`) and the `eta` of the 202 answer.
  Then a governed unload (not timed). The estimator behind `eta` learns from every load
  of this runner, the untimed first one included, so the etas are listed in order.
- preload: one runner per load with `preload: true`; the "ready in N ms" line of its log.
- by hand: the exact argv the runner gave its llama-server (read from /proc), with a new
  port, api key and slot directory; timed from spawn to the first 200 of /health, polled
  every `--poll-ms` on a fresh connection; then stopped.
Runner and by-hand loads alternate in pairs (R H, H R, ...); every ratio is per pair, the
median and [min, max] are reported. Both engines run with `--log-timestamps`, so each load
also tells the time spent outside the engine's own start: the load's figure minus the
engine's "model loaded" timestamp (time since its own start), which cancels the engine's
run-to-run noise (the runner's copy of the log is read from GET /v1/models/{id}/logs).
Writes `bench/results/coldload-<time>.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

from bench.coldload.report import MODEL, eta_rows, markdown, summarize
from bench.prefix.engines import (
    Served,
    cmdline,
    health_ok,
    kill_group,
    require_engine,
    start_runner,
)
from bench.proxy.procs import (
    REPO_ROOT,
    cpu_seconds,
    free_port,
    loadavg,
    machine_cpu_busy_s,
    machine_facts,
    wait_quiet,
)
from runner.memory.proc import child_pids
from tests.support.tokens import DEV_REGISTRY, dev_token

READY = re.compile(r"model (\S+) ready in (\d+) ms")
ADMIN = "bench"
GOVERNED_ENV = {
    "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
    "RUNNER_ID": "test-runner",
    "ADMIN_TENANTS": ADMIN,
}
TIMESTAMPED = "--log-timestamps"
# llama-server's --log-timestamps prefix is minutes.seconds.milliseconds.microseconds
LOADED = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*model loaded", re.MULTILINE)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def model_entry(preload: bool) -> str:
    """The repository's default models file, only `preload` set for this bench."""
    doc = yaml.safe_load((REPO_ROOT / "models.yaml").read_text())
    entry = next(m for m in doc["models"] if m["id"] == MODEL)
    entry = {**entry, "preload": preload, "args": [*entry.get("args", []), TIMESTAMPED]}
    return yaml.safe_dump({"models": [entry]}, sort_keys=False)


def engine_loaded_ms(log_text: str) -> float | None:
    """When the engine said "model loaded", in ms since its own start (its log timestamp)."""
    m = LOADED.search(log_text)
    if m is None:
        return None
    minutes, seconds, ms, us = (int(g) for g in m.groups())
    return (minutes * 60 + seconds) * 1e3 + ms + us / 1e3


def outside_engine_ms(load_ms: float, log_text: str) -> float | None:
    engine_ms = engine_loaded_ms(log_text)
    return None if engine_ms is None else load_ms - engine_ms


def ready_times(served: Served) -> list[int]:
    return [int(m.group(2)) for m in READY.finditer(served.log()) if m.group(1) == MODEL]


def engine_pid(served: Served) -> int:
    """The pid of the llama-server the runner started (its child process)."""
    for pid in child_pids(served.proc.pid) or []:
        argv = cmdline(pid)
        if argv and argv[0].endswith("llama-server"):
            return pid
    raise RuntimeError("the runner has no llama-server child")


def by_hand_argv(template: list[str], port: int, slot_dir: str) -> list[str]:
    """`template` with its own port, a fresh api key and slot directory; all else equal."""
    argv = list(template)
    fresh = {"--port": str(port), "--api-key": secrets.token_urlsafe(24)}
    fresh["--slot-save-path"] = slot_dir
    for flag, value in fresh.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
    return argv


class Meter:
    """Cores the rest of the machine used over an interval (everything but `mine`)."""

    def __init__(self, *mine: int) -> None:
        self.mine = list(mine)
        self.busy0 = machine_cpu_busy_s()
        self.mine0 = sum(cpu_seconds(p) for p in self.mine)
        self.t0 = time.monotonic()

    def others_cores(self, *more: int) -> float:
        """`more`: processes of ours that started meanwhile (counted from zero)."""
        busy = machine_cpu_busy_s() - self.busy0
        mine = sum(cpu_seconds(p) for p in self.mine) - self.mine0
        mine += sum(cpu_seconds(p) for p in more)
        return max(0.0, busy - mine) / max(1e-3, time.monotonic() - self.t0)


def load_by_hand(template: list[str], poll_s: float) -> dict[str, Any]:
    """Spawn, poll /health until 200, stop. Milliseconds from spawn to healthy, the CPU
    seconds the engine used to get there, and how busy the rest of the machine was."""
    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="bench-coldload-") as slot_dir,
        tempfile.TemporaryFile() as output,
    ):
        argv = by_hand_argv(template, port, slot_dir)
        url = f"http://127.0.0.1:{port}"
        meter = Meter(os.getpid())
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while not health_ok(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode}")
                if time.monotonic() - t0 > 120:
                    raise RuntimeError("llama-server not healthy within 120 s")
                time.sleep(poll_s)
            ms = (time.monotonic() - t0) * 1e3
            engine_cpu_s = cpu_seconds(proc.pid)
            others = meter.others_cores(proc.pid)
        finally:
            kill_group(proc)
        output.seek(0)
        outside = outside_engine_ms(ms, output.read().decode(errors="replace"))
    return {"ms": ms, "engine_cpu_s": engine_cpu_s, "other_cores": others, "outside_ms": outside}


def load_via_api(served: Served, poll_s: float, keep_argv: bool = False) -> dict[str, Any]:
    """Governed load, poll the task until completed, then a governed unload (not timed).
    `keep_argv`: also read the engine's command line before it is unloaded."""
    before = len(ready_times(served))
    token = dev_token("model-load", MODEL, {})
    meter = Meter(os.getpid(), served.proc.pid)
    runner_cpu0 = cpu_seconds(served.proc.pid)
    t0 = time.monotonic()
    r = httpx.post(
        served.url + "/v1/models/load",
        json={"modelId": MODEL, "verifiedOpToken": token},
        timeout=30,
    )
    if r.status_code != 202:
        raise RuntimeError(f"load answered {r.status_code}: {r.text[:300]}")
    accepted = r.json()
    task_id = accepted["taskId"]
    while True:
        doc = httpx.get(f"{served.url}/v1/models/load/{task_id}", timeout=10).json()
        if doc["status"] in ("completed", "failed", "cancelled"):
            break
        if time.monotonic() - t0 > 180:
            raise RuntimeError(f"load task {task_id} not done within 180 s: {doc}")
        time.sleep(poll_s)
    wall_ms = (time.monotonic() - t0) * 1e3
    runner_cpu_s = cpu_seconds(served.proc.pid) - runner_cpu0
    if doc["status"] != "completed":
        raise RuntimeError(f"load task {task_id} {doc['status']}: {doc.get('error')}")
    engine = engine_pid(served)
    engine_cpu_s = cpu_seconds(engine)
    others = meter.others_cores(engine)
    ready = ready_times(served)
    argv = cmdline(engine) if keep_argv else None
    logs = httpx.get(
        f"{served.url}/v1/models/{MODEL}/logs", headers={"X-Tenant-ID": ADMIN}, timeout=10
    ).json()["lines"]
    token = dev_token("model-unload", MODEL, {})
    u = httpx.post(
        served.url + "/v1/models/unload",
        json={"modelId": MODEL, "verifiedOpToken": token},
        timeout=120,
    )
    if u.status_code != 200:
        raise RuntimeError(f"unload answered {u.status_code}: {u.text[:300]}")
    out: dict[str, Any] = {
        "ms": float(doc["loadTimeMs"]),
        "pool_ready_ms": ready[before] if len(ready) > before else None,
        "client_wall_ms": wall_ms,
        "eta_s": accepted.get("eta"),
        "engine_cpu_s": engine_cpu_s,
        "runner_cpu_s": runner_cpu_s,
        "other_cores": others,
        "outside_ms": outside_engine_ms(float(doc["loadTimeMs"]), "\n".join(logs)),
    }
    if argv is not None:
        out["argv"] = argv
    return out


def load_via_preload() -> tuple[dict[str, Any], list[str]]:
    """A runner started with `preload: true`: the pool's 'ready in N ms' from its log."""
    t0 = time.monotonic()
    with start_runner(model_entry(preload=True)) as served:
        wall_ms = (time.monotonic() - t0) * 1e3
        times = ready_times(served)
        argv = cmdline(engine_pid(served))
    if not times:
        raise RuntimeError("the runner logged no 'ready in' line")
    return {"ms": float(times[0]), "runner_start_to_healthy_ms": wall_ms}, argv


def has_load_api() -> bool:
    with start_runner(model_entry(preload=False), env=GOVERNED_ENV) as served:
        r = httpx.post(served.url + "/v1/models/load", json={}, timeout=10)
    return r.status_code not in (404, 405)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    poll_s, task_poll_s = args.poll_ms / 1e3, args.task_poll_ms / 1e3
    pairs: list[dict[str, Any]] = []
    warm: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        served: Served | None = None
        if args.via == "api":
            served = stack.enter_context(start_runner(model_entry(False), env=GOVERNED_ENV))
            warm["runner"] = load_via_api(served, task_poll_s, keep_argv=True)  # untimed
            template = warm["runner"].pop("argv")
        else:
            warm["runner"], template = load_via_preload()
        warm["by_hand"] = load_by_hand(template, poll_s)
        _log(f"warm-up done; engine argv: {' '.join(template[1:])}")
        watch = {"runner": served.proc.pid} if served is not None else {}
        for i in range(args.reps):
            order = ("runner", "by_hand") if i % 2 == 0 else ("by_hand", "runner")
            quiet = wait_quiet(watch, args.quiet_below, args.quiet_wait)
            pair: dict[str, Any] = {"order": order, "loadavg": loadavg(), "quiet": quiet}
            for side in order:
                time.sleep(args.settle_s)  # every load starts from the same settled state
                if side == "by_hand":
                    pair[side] = load_by_hand(template, poll_s)
                elif served is not None:
                    pair[side] = load_via_api(served, task_poll_s)
                else:
                    pair[side] = load_via_preload()[0]
            pair["ratio"] = pair["runner"]["ms"] / pair["by_hand"]["ms"]
            _log(
                f"pair {i + 1}: runner {pair['runner']['ms']:.0f} ms, by hand "
                f"{pair['by_hand']['ms']:.0f} ms, ratio {pair['ratio']:.3f}"
                + (f", eta {pair['runner']['eta_s']} s" if "eta_s" in pair["runner"] else "")
            )
            pairs.append(pair)
    return {"warm": warm, "pairs": pairs, "argv": template}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.coldload.run", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 pairs (~1 min)")
    p.add_argument("--reps", type=int, default=8, help="interleaved pairs")
    p.add_argument("--via", choices=("auto", "api", "preload"), default="auto")
    p.add_argument("--poll-ms", type=float, default=20.0, help="by hand: /health poll")
    p.add_argument(
        "--task-poll-ms",
        type=float,
        default=200.0,
        help="runner: load-task poll (its loadTimeMs is measured inside the runner; polling "
        "faster spends the runner's CPU, which the engine needs on a 2-core machine)",
    )
    p.add_argument("--settle-s", type=float, default=2.0, help="pause before each load")
    p.add_argument("--quiet-below", type=float, default=0.5, help="cores used by others")
    p.add_argument("--quiet-wait", type=float, default=10.0, help="max seconds to wait")
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 3
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_engine()
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    facts = machine_facts()
    load0 = loadavg()
    try:
        if args.via == "auto":
            args.via = "api" if has_load_api() else "preload"
        _log(f"loads through the runner via {args.via}; load average {load0}")
        measured = measure(args)
    except KeyboardInterrupt:
        _log("interrupted; everything started was stopped")
        return 130
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.coldload.run " + " ".join(sys.argv[1:]),
        "machine": {k: facts[k] for k in ("nproc", "cpu", "python", "git_head")},
        "via": args.via,
        "poll_ms": args.poll_ms,
        "task_poll_ms": args.task_poll_ms,
        "settle_s": args.settle_s,
        "quiet_below": args.quiet_below,
        "quiet_wait_s": args.quiet_wait,
        "loadavg_before": load0,
        "loadavg_after": loadavg(),
        **measured,
    }
    result["flags"] = _public_flags(result["argv"])
    result["summary"] = summarize(result["pairs"], args.via, args.quiet_below)
    if args.via == "api":
        result["eta"] = eta_rows(result)
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"coldload-{started.strftime('%Y%m%dT%H%M%S')}.json"
    result.pop("argv")
    out.write_text(json.dumps(result, indent=1))
    print("\n" + markdown(result) + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


def _public_flags(argv: list[str]) -> list[str]:
    """The engine's flags with the per-process secrets and paths masked."""
    out = [Path(argv[0]).name]
    masked = {"--api-key": "<random>", "--port": "<free>", "--slot-save-path": "<private dir>"}
    skip = False
    for i, a in enumerate(argv[1:], 1):
        if skip:
            skip = False
            continue
        if a in masked:
            out += [a, masked[a]]
            skip = True
        elif a == "-m":
            out += [a, Path(argv[i + 1]).name]
            skip = True
        else:
            out.append(a)
    return out


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
