"""A mixed run of requests through a runner, drawn by Hypothesis, and what it was charged
against what the engine generated (tests/support/engine_counters.py).

A request is whole or streamed (with or without `stream_options.include_usage`) or a
stream the client leaves after a few tokens; from one of two tenants; chat or completions;
with a varied `max_tokens` and, sometimes, stop sequences. The runner's tenants come in
through the gateway's fairness header (`gateway_env`), whose admin reads `GET /v1/usage`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import strategies as st

from tests.support.engine_counters import EngineCounters
from tests.support.poll import eventually
from tests.support.tokens import FAIRNESS

TENANTS = ("alpha", "beta")
ADMIN = "alpha"
MODES = ("whole", "stream", "stream_usage", "cancel")
PROMPTS = (
    "Tell a long story about a ship at sea.",
    "List the colours of the rainbow, one per line.",
    "Count from one to fifty in words.",
    "Describe a city at night, at length.",
)


@dataclass(frozen=True)
class Req:
    tenant: str
    chat: bool
    mode: str
    max_tokens: int
    prompt: str
    stop: tuple[str, ...] = ()
    cut_after: int = 2  # content chunks a `cancel` reads before leaving

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.stop:
            body["stop"] = list(self.stop)
        if self.mode != "whole":
            body["stream"] = True
        if self.mode == "stream_usage":
            body["stream_options"] = {"include_usage": True}
        return body


requests = st.builds(
    Req,
    tenant=st.sampled_from(TENANTS),
    chat=st.booleans(),
    mode=st.sampled_from(MODES),
    max_tokens=st.integers(1, 48),
    prompt=st.sampled_from(PROMPTS),
    stop=st.sampled_from(((), ("\n",), (".", "!"), ("the",))),
    cut_after=st.integers(1, 4),
)
batches = st.lists(requests, min_size=1, max_size=4)


def send(url: str, model: str, req: Req) -> str:
    """One request; a `cancel` leaves after `cut_after` content chunks. Its status, and
    its error when refused (`200` alone when served)."""
    path = "/v1/chat/completions" if req.chat else "/v1/completions"
    headers = {FAIRNESS: req.tenant}
    if req.mode == "whole":
        answer = httpx.post(url + path, json=req.body(model), headers=headers, timeout=300)
        return "200" if answer.status_code == 200 else f"{answer.status_code} {answer.text}"
    with httpx.stream(
        "POST", url + path, json=req.body(model), headers=headers, timeout=300
    ) as answer:
        if answer.status_code != 200:
            return f"{answer.status_code} {answer.read().decode()}"
        seen = 0
        for line in answer.iter_lines():
            seen += '"content":"' in line or '"text":"' in line
            if req.mode == "cancel" and seen >= req.cut_after:
                break
        return "200"


def charged(url: str, model: str) -> tuple[int, int]:
    """(requests, completion tokens) the usage holds for `model`, every tenant."""
    doc = httpx.get(url + "/v1/usage", headers={FAIRNESS: ADMIN}, timeout=30).json()
    rows = [row for row in doc["data"] if row["model"] == model]
    return sum(r["requests"] for r in rows), sum(r["completionTokens"] for r in rows)


@dataclass
class Tally:
    """The run so far: engine-generated and charged output tokens, summed over batches."""

    generated: int = 0
    charged: int = 0
    requests: int = 0
    cancels: int = 0
    batches: list[tuple[int, int]] = field(default_factory=list)  # (generated, charged)

    def within(self, share: float, per_cut: int) -> bool:
        """Never below the engine; above by at most `share` of it plus `per_cut` for each
        stream left early (what the runner cannot see the engine make after the cut)."""
        top = self.generated * (1 + share) + per_cut * self.cancels
        return self.generated <= self.charged <= top


def run_batch(
    url: str, model: str, engine: EngineCounters, batch: list[Req], tally: Tally
) -> tuple[int, int]:
    """Run `batch` concurrently; once the engine is idle and the usage holds every request,
    the output tokens the engine generated for it and those the runner charged."""
    eventually(engine.idle, timeout=120)
    requests_before, charged_before = charged(url, model)
    generated_before = engine.generated()
    with ThreadPoolExecutor(3) as pool:
        statuses = list(pool.map(lambda r: send(url, model, r), batch))
    assert all(s == "200" for s in statuses), statuses
    eventually(engine.idle, timeout=120)
    want = requests_before + len(batch)
    eventually(lambda: charged(url, model)[0] >= want, timeout=60)
    generated = engine.generated() - generated_before
    spent = charged(url, model)[1] - charged_before
    tally.generated += generated
    tally.charged += spent
    tally.requests += len(batch)
    tally.cancels += sum(r.mode == "cancel" for r in batch)
    tally.batches.append((generated, spent))
    return generated, spent
