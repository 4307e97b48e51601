"""The soak's load: chat requests from several tenants (each saying how long its client
waits, `X-Request-Deadline-Ms`), governed cache-flush tokens each sent twice at once to
its runner and once more later, and async image jobs, read to their end once the load
stops; every answer recorded."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from bench.chaos.fleet import JOB_MODEL, MAX_TOKENS, ChaosFleet, Slot, runner_id
from tests.support.tokens import dev_token


@dataclass(frozen=True)
class Answer:
    """One request and what came back (`status` 0: no HTTP answer, `error` says why)."""

    kind: str  # "chat", "real" (the real llama-server) or "flush"
    tenant: str
    slot: int
    generation: int
    started: float
    ended: float
    status: int
    retry_after: bool
    code: str
    error: str
    output_tokens: int
    token: str = ""  # a flush: which token (t0, t1, ...)
    job: str = ""  # an async job: its id


CLIENT_TIMEOUT_S = 60.0
DEADLINE_MS = 50_000  # what each chat request says its client waits (below the timeout)
JOB_STATES = ("succeeded", "failed", "cancelled")


@dataclass
class Job:
    """One async job accepted (202): its seed (its image's colour) and how it ended."""

    id: str
    seed: int
    slot: int
    status: str = ""  # its last state read; "lost": read 404; "unfinished": never ended
    code: str = ""  # a failed job's error code
    reads: list[int] = field(default_factory=list)  # the statuses of its GETs


def send(
    slot: Slot,
    kind: str,
    tenant: str,
    path: str,
    body: dict[str, object],
    token: str = "",
    headers: dict[str, str] | None = None,
) -> Answer:
    """POST `body` to `slot`'s runner; the answer, or the transport error, recorded."""
    generation, started = slot.generation, time.monotonic()
    status, retry, code, error, tokens, job = 0, False, "", "", 0, ""
    try:
        headers = {**(headers or {}), **({"X-Tenant-ID": tenant} if tenant else {})}
        r = httpx.post(slot.url + path, json=body, headers=headers, timeout=CLIENT_TIMEOUT_S)
        status, retry = r.status_code, "retry-after" in r.headers
        doc = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if isinstance(doc, dict):
            err = doc.get("error")
            code = str(err.get("code", "")) if isinstance(err, dict) else ""
            usage = doc.get("usage")
            if status == 200 and isinstance(usage, dict):
                tokens = int(usage.get("completion_tokens") or 0)
            if status == 202:
                job = str(doc.get("id", ""))
    except (httpx.TransportError, ValueError) as exc:
        error = type(exc).__name__
    return Answer(
        kind,
        tenant,
        slot.index,
        generation,
        started,
        time.monotonic(),
        status,
        retry,
        code,
        error,
        tokens,
        token,
        job,
    )


class Load:
    """`workers` threads, each one request at a time, at most one every `pace_s`."""

    def __init__(
        self, fleet: ChaosFleet, tenants: list[str], workers: int, pace_s: float, real_share: float
    ) -> None:
        self.fleet = fleet
        self.tenants = tenants
        self.workers = workers
        self.pace_s = pace_s
        self.real_share = real_share if fleet.real is not None else 0.0
        self.answers: list[Answer] = []
        self.tokens: dict[str, dict[str, object]] = {}  # nonce -> token
        self.jobs: list[Job] = []
        self._seeds = itertools.count(1)  # 0: the engine's warm-up
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers + 2)
        self._busy: set[int] = set()  # slots being restarted: no request is sent to them

    def keep(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def restarting(self, index: int, on: bool) -> None:
        with self._lock:
            (self._busy.add if on else self._busy.discard)(index)

    def _pick(self, rng: random.Random) -> Slot | None:
        with self._lock:
            live = [s for s in self.fleet.slots if s.index not in self._busy]
        return rng.choice(live) if live else None

    def start(self) -> None:
        for n in range(self.workers):
            self._pool.submit(self._chat, n)
        self._pool.submit(self._flushes)
        self._pool.submit(self._jobs)

    def join(self) -> None:
        self.stop.set()
        self._pool.shutdown(wait=True)

    def _chat(self, n: int) -> None:
        rng = random.Random(n)
        while not self.stop.is_set():
            tick = time.monotonic()
            slot = self._pick(rng)
            if slot is not None:
                tenant = self.tenants[n % len(self.tenants)]
                real = rng.random() < self.real_share and not {0} & self._busy
                model, kind = ("real", "real") if real else ("m", "chat")
                target = self.fleet.slots[0] if real else slot
                body = {
                    "model": model,
                    "max_tokens": MAX_TOKENS,
                    "messages": [{"role": "user", "content": f"say hi {n}"}],
                }
                deadline = {"X-Request-Deadline-Ms": str(DEADLINE_MS)}
                self.keep(send(target, kind, tenant, "/v1/chat/completions", body, "", deadline))
            self.stop.wait(max(0.0, self.pace_s - (time.monotonic() - tick)))  # a schedule

    def _live(self) -> list[Slot]:
        with self._lock:
            return [s for s in self.fleet.slots if s.index not in self._busy]

    def _flushes(self, every_s: float = 2.0) -> None:
        """Each round: a new token for one runner (its `aud`), sent to it twice at once,
        and last round's token once more to its own runner."""
        rng, previous = random.Random(99), None
        while not self.stop.is_set():
            tick = time.monotonic()
            live = self._live()
            if live:
                slot = rng.choice(live)
                aud = runner_id(slot.index)
                token = dev_token("cache-flush", None, {"scope": "all"}, aud=aud)
                name = f"t{len(self.tokens)}"
                self.tokens[name] = token
                sends = [(slot, token, name), (slot, token, name)]  # the same token, at once
                if previous is not None and previous[0] in {s.index for s in live}:
                    index, old, old_name = previous
                    sends.append((self.fleet.slots[index], old, old_name))  # and again, later
                with ThreadPoolExecutor(3) as pool:
                    done = [pool.submit(self._flush, *s) for s in sends]
                for future in done:
                    self.keep(future.result())
                previous = (slot.index, token, name)
            self.stop.wait(max(0.0, every_s - (time.monotonic() - tick)))

    def _flush(self, slot: Slot, token: dict[str, object], name: str) -> Answer:
        body: dict[str, object] = {"scope": "all", "verifiedOpToken": token}
        return send(slot, "flush", "", "/v1/cache/flush", body, name)

    def _jobs(self, every_s: float = 1.0) -> None:
        """An async image job every `every_s` to a live runner, its seed its own."""
        rng = random.Random(7)
        while not self.stop.is_set():
            tick = time.monotonic()
            live = self._live()
            if live:
                slot, seed = rng.choice(live), next(self._seeds)
                body: dict[str, object] = {"model": JOB_MODEL, "prompt": "x", "x_seed": seed}
                answer = send(
                    slot,
                    "job",
                    "large",
                    "/v1/images/generations",
                    body,
                    "",
                    {"Prefer": "respond-async"},
                )
                self.keep(answer)
                if answer.status == 202 and answer.job:
                    self.jobs.append(Job(answer.job, seed, slot.index))
            self.stop.wait(max(0.0, every_s - (time.monotonic() - tick)))

    def settle_jobs(self, timeout_s: float = 120.0) -> None:
        """Once the load stopped: read every accepted job on the runners until it ended
        (any replica answers: jobs live in Redis), within `timeout_s` in all; a job read
        404 there is lost."""
        deadline = time.monotonic() + timeout_s
        todo = list(self.jobs)
        while todo and time.monotonic() < deadline:
            for job in list(todo):
                slot = self.fleet.slots[len(job.reads) % len(self.fleet.slots)]
                try:
                    r = httpx.get(
                        f"{slot.url}/v1/jobs/{job.id}", headers={"X-Tenant-ID": "large"}, timeout=10
                    )
                except httpx.TransportError:
                    continue
                job.reads.append(r.status_code)
                if r.status_code == 404:
                    job.status = "lost"
                    todo.remove(job)
                elif r.status_code == 200:
                    doc = r.json()
                    job.status = str(doc.get("status", ""))
                    error = doc.get("error")
                    job.code = str(error.get("code", "")) if isinstance(error, dict) else ""
                    if job.status in JOB_STATES:
                        todo.remove(job)
            threading.Event().wait(0.5)  # between rounds of reads (nothing sets it)
        for job in todo:
            job.status = job.status or "unfinished"


def first_ok(answers: list[Answer], after: float, where: Callable[[Answer], bool]) -> float | None:
    """The end of the first 200 among requests started after `after` that `where` keeps."""
    ends = [a.ended for a in answers if a.status == 200 and a.started >= after and where(a)]
    return min(ends) if ends else None
