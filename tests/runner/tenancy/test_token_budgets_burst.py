"""Issue 36's attack on token budgets, through real runners in front of the fake OpenAI
engine (it reports usage as llama-server does, 100 ms an answer): one tenant, 64 clients
sending 256 requests at once with `max_tokens: 100`, each using 17 tokens. Each
request reserves its whole bound (about 300 tokens: the body's bytes, the template's
allowance and max_tokens), so only about 13 fit the budget at a time; the rest must
wait for those to settle instead of being refused while the budget is unspent. The
budget is used to within one reservation (>= 90% of it here) and never overspent, on one
runner (counters in memory) and on two replicas sharing Redis. At the issue's own 1500
total tokens, the fake attached as llama-server (a kind that counts prompts): the waiting
requests are reserved on their counted prompt, 108 tokens, and >= 90% is used there too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.poll import eventually
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import start_runner

pytestmark = pytest.mark.timeout(240)

BUDGET = 4000  # about 13 reservations: what stays unusable is less than one
TENANTS = f"""
tenants:
  burst:
    token_budgets: [{{tokens: {BUDGET}, per: day}}]
"""
BODY = {
    "model": "echo",
    "messages": [{"role": "user", "content": "tell me one short thing about the sea"}],
    "max_tokens": 100,
}  # the fake answers "echo: <content>": 8 prompt + 9 completion tokens
ENV = {"QUEUE_TIMEOUT_MS": "120000", "TOKEN_BUDGET_WAIT_MS": "120000"}


@pytest.fixture
def tenants_file(tmp_path: Path) -> str:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return str(path)


def burst(urls: list[str], clients: int = 64, requests: int = 256) -> list[httpx.Response]:
    """`clients` clients, `requests` in all, each client sending its share one after the
    other (no retries), to the runners in turn."""

    async def client(i: int, http: httpx.AsyncClient) -> list[httpx.Response]:
        url = urls[i % len(urls)] + "/v1/chat/completions"
        head = {"X-Tenant-ID": "burst"}
        return [await http.post(url, json=BODY, headers=head) for _ in range(requests // clients)]

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(timeout=180, limits=limits) as http:
            shares = await asyncio.gather(*(client(i, http) for i in range(clients)))
        return [answer for share in shares for answer in share]

    return asyncio.run(run())


def served_and_refused(answers: list[httpx.Response]) -> tuple[int, list[Any]]:
    served = sum(a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200)
    refused = [a.json()["error"] for a in answers if a.status_code != 200]
    return served, refused


def check_burst(answers: list[httpx.Response]) -> None:
    served, refused = served_and_refused(answers)
    assert served <= BUDGET, f"{served} tokens served of a {BUDGET}-token budget"
    assert served >= 0.9 * BUDGET, (
        f"only {served} of {BUDGET} tokens usable; {len(refused)} refused, first: {refused[:1]}"
    )
    assert {e["code"] for e in refused} <= {"token_budget_exceeded"}, refused[:3]


@pytest.fixture
def one_runner(tenants_file: str) -> Iterator[list[str]]:
    with (
        start_fake("fake_openai", "--latency-ms", "100") as engine,
        start_runner({"echo": engine.url}, env={**ENV, "TENANTS_FILE": tenants_file}) as r,
    ):
        yield [r.url]


@pytest.fixture
def two_replicas(tenants_file: str) -> Iterator[list[str]]:
    server = RedisServer().start()
    with ExitStack() as stack:
        stack.callback(server.stop)
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "100"))
        # Redis calls are given 5 s, not 250 ms: on a loaded machine a call past its
        # timeout loses its reservation's or settlement's answer, which stays counted as
        # held until the window ends (docs/tenants.md), and waiters then wait their bound
        env = {**ENV, "TENANTS_FILE": tenants_file, "REDIS_URL": server.url,
               "TOKEN_BUDGET_STORE_TIMEOUT_MS": "5000"}  # fmt: skip
        runners = [
            stack.enter_context(start_runner({"echo": engine.url}, env={**env, "RUNNER_ID": rid}))
            for rid in ("burst-a", "burst-b")
        ]
        yield [r.url for r in runners]


def test_budget_burst_one_runner_uses_the_budget_without_overshoot(
    one_runner: list[str],
) -> None:
    """256 requests at once, each reserving ~20x what it uses: the budget is >= 90% used
    and never overspent; refusals come only once the spent tokens leave no room."""
    answers = burst(one_runner)
    check_burst(answers)
    refused = [a for a in answers if a.status_code == 429]
    assert refused, "demand is above the budget: the last ones are refused"
    assert all(int(a.headers["retry-after"]) > 60 for a in refused)  # the day's end


def test_budget_burst_two_replicas_use_one_budget_without_overshoot(
    two_replicas: list[str],
) -> None:
    """The same burst over two replicas sharing Redis (each waiting for the other's
    settlements too): >= 90% of the one budget used, never more than it."""
    check_burst(burst(two_replicas))


GONE_TENANTS = """
tenants:
  gone:
    token_budgets: [{tokens: 700, per: day}]
"""


def test_budget_burst_client_gone_while_waiting_reserves_nothing(tmp_path: Path) -> None:
    """Two slow requests hold the budget (two reservations of ~292 in 700). One with a
    300 ms deadline waits that long and is refused (429, Retry-After 1); a third waits
    and its client leaves: it is counted 499 and never reserves, so once the two are
    settled the next request finds exactly their usage spent."""
    path = tmp_path / "tenants.yaml"
    path.write_text(GONE_TENANTS)
    env = {**ENV, "TENANTS_FILE": str(path)}
    with (
        start_fake("fake_openai", "--latency-ms", "3000") as engine,
        start_runner({"echo": engine.url}, env=env) as r,
        httpx.Client(timeout=30) as http,
    ):
        url, head = r.url + "/v1/chat/completions", {"X-Tenant-ID": "gone"}
        with ThreadPoolExecutor(2) as pool:
            slow = [pool.submit(http.post, url, json=BODY, headers=head) for _ in range(2)]
            eventually(lambda: httpx.get(engine.url + "/_fake/stats").json()["in_flight"] == 2)
            late = {**head, "X-Request-Deadline-Ms": "300"}
            refused = http.post(url, json=BODY, headers=late)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "token_budget_exceeded"
            assert refused.headers["retry-after"] == "1"
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=BODY, headers=head, timeout=0.3)
            used = [f.result().json()["usage"]["total_tokens"] for f in slow]
        eventually(lambda: 'status="499",tenant="gone"' in _requests_metric(r.url))
        after = http.post(url, json=BODY, headers=head)
        assert after.status_code == 200, after.text
        remaining = int(after.headers["x-ratelimit-remaining-tokens"])
        reserved = 700 - sum(used) - remaining  # what `after` itself reserved
        assert 250 < reserved < 350, (used, remaining)  # one reservation, not two


def _requests_metric(url: str) -> str:
    lines = httpx.get(url + "/metrics").text.splitlines()
    return "\n".join(line for line in lines if line.startswith("quorum_requests_total"))


SMALL = 1500  # issue 36's own budget: one byte bound (292) is a fifth of it


def test_budget_burst_counted_prompts_use_a_small_budget(tmp_path: Path) -> None:
    """Issue 36's own setting, 1500 total tokens a minute, the fake attached as
    llama-server (a kind that counts prompts): the requests that would wait are reserved
    on their counted prompt (8 + 100, not 292), so >= 90% of the budget is used, never
    more than it."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS.replace(f"tokens: {BUDGET}, per: day", f"tokens: {SMALL}, per: day"))
    models = "models:\n  - {id: echo, backend: llama-server, url: '%s', parallel: 64}\n"
    with (
        start_fake("fake_openai", "--latency-ms", "100") as engine,
        start_runner(models_file=models % engine.url, env={**ENV, "TENANTS_FILE": str(path)}) as r,
    ):
        answers = burst([r.url])
    served, refused = served_and_refused(answers)
    assert served <= SMALL, f"{served} tokens served of a {SMALL}-token budget"
    assert served >= 0.9 * SMALL, f"only {served} of {SMALL} usable; first: {refused[:1]}"
    assert {e["code"] for e in refused} <= {"token_budget_exceeded"}, refused[:3]
    assert {e["requested"] for e in refused} == {108}  # the counted prompt + max_tokens
