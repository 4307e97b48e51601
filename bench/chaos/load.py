"""The soak's load: chat requests from several tenants, and governed cache-flush tokens
each sent to two runners at once and once more later; every answer recorded."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from bench.chaos.fleet import FLEET_ID, MAX_TOKENS, ChaosFleet, Slot
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


def send(
    slot: Slot, kind: str, tenant: str, path: str, body: dict[str, object], token: str = ""
) -> Answer:
    """POST `body` to `slot`'s runner; the answer, or the transport error, recorded."""
    generation, started = slot.generation, time.monotonic()
    status, retry, code, error, tokens = 0, False, "", "", 0
    try:
        headers = {"X-Tenant-ID": tenant} if tenant else {}
        r = httpx.post(slot.url + path, json=body, headers=headers, timeout=60)
        status, retry = r.status_code, "retry-after" in r.headers
        doc = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if isinstance(doc, dict):
            err = doc.get("error")
            code = str(err.get("code", "")) if isinstance(err, dict) else ""
            usage = doc.get("usage")
            if status == 200 and isinstance(usage, dict):
                tokens = int(usage.get("completion_tokens") or 0)
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
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers + 1)
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
                self.keep(send(target, kind, tenant, "/v1/chat/completions", body))
            self.stop.wait(max(0.0, self.pace_s - (time.monotonic() - tick)))  # a schedule

    def _flushes(self, every_s: float = 2.0) -> None:
        """Each round: a new token to two runners at once, and last round's to a third."""
        rng, previous = random.Random(99), None
        while not self.stop.is_set():
            tick = time.monotonic()
            token = dev_token("cache-flush", None, {"scope": "all"}, aud=FLEET_ID)
            name = f"t{len(self.tokens)}"
            self.tokens[name] = token
            with self._lock:
                live = [s for s in self.fleet.slots if s.index not in self._busy]
            pair = rng.sample(live, min(2, len(live)))
            sends = [(slot, token, name) for slot in pair]  # the same token, at once
            if previous is not None and live:
                sends.append((rng.choice(live), *previous))  # and again, later
            with ThreadPoolExecutor(3) as pool:
                done = [pool.submit(self._flush, *s) for s in sends]
            for future in done:
                self.keep(future.result())
            previous = (token, name)
            self.stop.wait(max(0.0, every_s - (time.monotonic() - tick)))

    def _flush(self, slot: Slot, token: dict[str, object], name: str) -> Answer:
        body: dict[str, object] = {"scope": "all", "verifiedOpToken": token}
        return send(slot, "flush", "", "/v1/cache/flush", body, name)


def first_ok(answers: list[Answer], after: float, where: Callable[[Answer], bool]) -> float | None:
    """The end of the first 200 among requests started after `after` that `where` keeps."""
    ends = [a.ended for a in answers if a.status == 200 and a.started >= after and where(a)]
    return min(ends) if ends else None
