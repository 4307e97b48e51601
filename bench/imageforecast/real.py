"""Issue 41, by hand on the real ComfyUI: the image wait forecast against the measured wait,
and the node-input refusals before the 202.

    .venv/bin/python -m bench.imageforecast.real [--runner http://127.0.0.1:18080]
        [--comfyui http://127.0.0.1:8188] [--large 640x640] [--small 128x128]
        [--only train,running,queue,shared,full,refusals]

Needs a runner serving `bench/imageforecast/real-models.yaml` (five models on one ComfyUI
attached by url; docs/engines.md "ComfyUI" has the commands), idle, with the default
fair queue. What it does:
1. train: `blur` and `blur2` (the same EmptyImage -> ImageBlur x4 graph, one slot group)
   each serve 128x128, 512x512 and 768x768 once, so their work fits have a slope;
2. running: a `--large` prompt runs; after 1, 4 and 8 s, `/v1/capabilities`
   `queue.forecastWaitMsByModel.blur.normal` is read and a `--small` request sent at once:
   the figure against its `X-Queue-Wait-Ms`;
3. queue: a large prompt runs and three more are sent, each by a tenant of its own (the
   figure is a new tenant's: a tenant already waiting is served after the others' heads),
   the figure read before each: against each one's wait;
4. shared: `blur2` runs a large prompt, then the figure of `blur` is read and a small `blur`
   request sent: one server, two models;
5. full: one large prompt runs and `queue.maxDepth` more wait; one more gets 503
   `queue_full`: its `Retry-After` against when the depth first fell below the maximum;
6. refusals: `x_seed` 16777216 on `coloured`, `prompt` "bogus" on `scaled`, `x_seed` on
   `free` (each sync and `Prefer: respond-async`): the status before any 202, and
   ComfyUI's `/history` and `/queue` unchanged (no prompt reached it); then 20 `coloured`
   requests without `x_seed`: all 200 (the drawn seed within 16777215).
Prints one line per measurement (forecast, wait, ratio) and writes them all to
`bench/results/imageforecast-real-<time>.json` with the load average. Only for a runner and
a ComfyUI on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

Row = dict[str, Any]


class Bench:
    def __init__(self, args: argparse.Namespace, http: httpx.AsyncClient) -> None:
        self.args = args
        self.http = http
        self.rows: list[Row] = []
        self.tenants = 0

    def tenant(self) -> str:
        self.tenants += 1
        return f"bench-{os.getpid()}-{self.tenants}"

    async def queue(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.args.runner}/v1/capabilities")
        queue: dict[str, Any] = response.json()["queue"]
        return queue

    async def forecast(self, model: str) -> int | None:
        by_model = (await self.queue())["forecastWaitMsByModel"]
        figure = by_model.get(model, {}).get("normal")
        return None if figure is None else int(figure)

    async def post(self, body: dict[str, Any], tenant: str, **headers: str) -> httpx.Response:
        headers = {"X-Tenant-ID": tenant, **headers}
        url = f"{self.args.runner}/v1/images/generations"
        return await self.http.post(url, json=body, headers=headers)

    def image(self, model: str, size: str, tenant: str) -> asyncio.Task[httpx.Response]:
        body = {"model": model, "prompt": "x", "size": size}
        return asyncio.create_task(self.post(body, tenant))

    async def until(self, running: int, depth: int = 0, limit_s: float = 60.0) -> None:
        """Wait until the runner shows `running` granted and `depth` waiting (bounded)."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            queue = await self.queue()
            if queue["running"] >= running and queue["depth"] >= depth:
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"the runner never showed {running} running and {depth} waiting")

    def record(self, scenario: str, forecast: int | None, response: httpx.Response) -> None:
        waited = int(response.headers.get("x-queue-wait-ms", "-1"))
        ratio = None if forecast is None else max(forecast, 250) / max(waited, 250)
        row = {
            "scenario": scenario,
            "status": response.status_code,
            "forecast_ms": forecast,
            "waited_ms": waited,
            "gpu_ms": int(response.headers.get("x-gpu-time-ms", "-1")),
            "ratio": ratio,
        }
        self.rows.append(row)
        shown = "-" if ratio is None else f"{ratio:.2f}"
        print(
            f"{scenario:<28} {response.status_code} forecast {forecast} ms, waited {waited} ms,"
            f" ratio {shown}",
            flush=True,
        )

    async def train(self) -> None:
        for model in ("blur", "blur2"):
            for size in ("128x128", "512x512", "768x768"):
                response = await self.image(model, size, "bench-train")
                self.record(f"train {model} {size}", None, response)

    async def running(self) -> None:
        for after_s in (1, 4, 8):
            large = self.image("blur", self.args.large, self.tenant())
            await self.until(1)
            await asyncio.sleep(after_s)
            forecast = await self.forecast("blur")
            response = await self.image("blur", self.args.small, self.tenant())
            self.record(f"running, {after_s} s in", forecast, response)
            await large

    async def queue_of_three(self) -> None:
        tasks = [self.image("blur", self.args.large, self.tenant())]
        await self.until(1)
        for place in (1, 2, 3):
            forecast = await self.forecast("blur")
            tasks.append(self.image("blur", self.args.large, self.tenant()))
            await self.until(1, place)
            tasks[-1].add_done_callback(self._recorder(f"queue, place {place}", forecast))
        await asyncio.gather(*tasks)

    def _recorder(self, scenario: str, forecast: int | None) -> Any:
        def done(task: asyncio.Task[httpx.Response]) -> None:
            self.record(scenario, forecast, task.result())

        return done

    async def shared(self) -> None:
        other = self.image("blur2", self.args.large, self.tenant())
        await self.until(1)
        await asyncio.sleep(2)
        forecast = await self.forecast("blur")
        response = await self.image("blur", self.args.small, self.tenant())
        self.record("shared: blur behind blur2", forecast, response)
        await other

    async def full(self) -> None:
        depth = int((await self.queue())["maxDepth"])
        tasks = [self.image("blur", self.args.large, self.tenant())]
        await self.until(1)
        for place in range(1, depth + 1):
            tasks.append(self.image("blur", self.args.large, self.tenant()))
            await self.until(1, place)
        refused = await self.image("blur", self.args.small, self.tenant())
        at = time.monotonic()
        while (await self.queue())["depth"] >= depth and time.monotonic() < at + 600:
            await asyncio.sleep(0.05)
        opened_ms = round(1000 * (time.monotonic() - at))
        retry = refused.headers.get("retry-after")
        forecast = None if retry is None else 1000 * int(retry)
        self.rows.append(
            {
                "scenario": "full",
                "status": refused.status_code,
                "code": refused.json().get("error", {}).get("code"),
                "retry_after_ms": forecast,
                "opened_ms": opened_ms,
            }
        )
        print(
            f"{'full: Retry-After':<28} {refused.status_code} {refused.json()['error']['code']}:"
            f" Retry-After {retry} s, a place opened after {opened_ms / 1000:.1f} s",
            flush=True,
        )
        await asyncio.gather(*tasks)

    async def comfyui_prompts(self) -> tuple[int, int]:
        history = (await self.http.get(f"{self.args.comfyui}/history")).json()
        queue = (await self.http.get(f"{self.args.comfyui}/queue")).json()
        return len(history), len(queue["queue_running"]) + len(queue["queue_pending"])

    async def refusals(self) -> None:
        before = await self.comfyui_prompts()
        cases: list[tuple[str, dict[str, Any]]] = [
            (
                "x_seed 16777216, seed feeds EmptyImage.color",
                {"model": "coloured", "prompt": "x", "x_seed": 16777216},
            ),
            ("upscale_method 'bogus'", {"model": "scaled", "prompt": "bogus"}),
            ("x_seed on a seedless template", {"model": "free", "prompt": "x", "x_seed": 5}),
        ]
        for label, body in cases:
            for mode, headers in (("sync", {}), ("async", {"Prefer": "respond-async"})):
                response = await self.post(body, "bench-refusals", **headers)
                error = response.json().get("error", {})
                self.rows.append(
                    {
                        "scenario": f"refusal {label} {mode}",
                        "status": response.status_code,
                        "error": error,
                    }
                )
                print(
                    f"refusal {mode:<5} {label}: {response.status_code} {error.get('code')}:"
                    f" {error.get('message')}",
                    flush=True,
                )
        after = await self.comfyui_prompts()
        self.rows.append(
            {"scenario": "comfyui prompts (history, queued)", "before": before, "after": after}
        )
        print(f"ComfyUI /history entries and queued prompts: before {before}, after {after}")
        statuses = []
        for _ in range(20):
            body = {"model": "coloured", "prompt": "x"}
            statuses.append((await self.post(body, "bench-refusals")).status_code)
        self.rows.append({"scenario": "coloured without x_seed", "statuses": statuses})
        print(f"coloured without x_seed, 20 requests: statuses {sorted(set(statuses))}")


async def run(args: argparse.Namespace) -> list[Row]:
    async with httpx.AsyncClient(timeout=600, trust_env=False) as http:
        bench = Bench(args, http)
        steps = {
            "train": bench.train,
            "running": bench.running,
            "queue": bench.queue_of_three,
            "shared": bench.shared,
            "full": bench.full,
            "refusals": bench.refusals,
        }
        for name in args.only.split(","):
            await steps[name]()
        return bench.rows


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runner", default="http://127.0.0.1:18080")
    p.add_argument("--comfyui", default="http://127.0.0.1:8188")
    p.add_argument("--large", default="640x640", help="the long prompt's size (10-20 s on CPU)")
    p.add_argument("--small", default="128x128")
    p.add_argument("--only", default="train,running,queue,shared,full,refusals")
    p.add_argument("--out", help="the JSON of every measurement (default bench/results/...)")
    args = p.parse_args()
    rows = asyncio.run(run(args))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"bench/results/imageforecast-real-{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"args": vars(args), "loadavg": os.getloadavg(), "rows": rows}
    out.write_text(json.dumps(doc, indent=1))
    print(f"load average {os.getloadavg()[0]:.1f}; rows in {out}")


if __name__ == "__main__":
    main()
