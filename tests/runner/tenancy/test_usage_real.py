"""Usage reconciled against the real llama-server's own figures (Gemma 3 270M GGUF,
scripts/install): a mixed run of whole, streamed and cancelled requests from three tenants
through one runner, compared with what the engine reported in each answer and with its own
`/metrics` counters (`llamacpp:prompt_tokens_total` + `prompt_tokens_cached_total`,
`llamacpp:tokens_predicted_total`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.memory.proc import child_pids
from runner.tenancy.guard import CUT_ALLOWANCE_TOKENS
from tests.runner.engines.test_llama_real import MODEL, _models
from tests.support.poll import eventually
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(600)

TENANTS = """
tenants:
  alpha:
    token_budgets: [{tokens: 200000, per: hour}]
  beta: {}
  gamma:
    token_budgets: [{tokens: 200000, per: day, count: output}]
"""


@pytest.fixture(scope="module")
def runner(
    tmp_path_factory: pytest.TempPathFactory, real_llama_server: LlamaServer
) -> Iterator[RunnerProcess]:
    folder = tmp_path_factory.mktemp("usage")
    (folder / "tenants.yaml").write_text(TENANTS)
    env = {
        "TENANTS_FILE": str(folder / "tenants.yaml"),
        **gateway_env("alpha"),  # an admin needs keys or a gateway: here the gateway
        "USAGE_DB": str(folder / "usage.sqlite3"),
    }
    with start_runner(
        models_file=_models(real_llama_server.gemma), env=env, ready_timeout=120
    ) as r:
        yield r


def _engine(r: RunnerProcess) -> tuple[str, str]:
    """The llama-server the runner started: its URL and its API key (its key file, which
    the test can read as the runner's user)."""
    for pid in child_pids(r.proc.pid) or []:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if "--alias" in argv and argv[argv.index("--alias") + 1] == MODEL:
            port = argv[argv.index("--port") + 1]
            key = Path(argv[argv.index("--api-key-file") + 1]).read_text().strip()
            return f"http://127.0.0.1:{port}", key
    raise AssertionError("no llama-server under the runner")


def _counters(url: str, key: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {key}"}).text
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("llamacpp:")
    }


def _body(content: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "temperature": 0, **extra}


def _whole(r: RunnerProcess, tenant: str, content: str) -> tuple[int, int]:
    """A whole answer: the engine's usage in it."""
    answer = httpx.post(r.url + "/v1/chat/completions", json=_body(content, max_tokens=8),
                        headers={FAIRNESS: tenant}, timeout=300)  # fmt: skip
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def _streamed(r: RunnerProcess, tenant: str, content: str, usage: bool) -> tuple[int, int]:
    """A stream to its end: the engine's usage chunk (include_usage) or its last chunk's
    timings (llama-server's own counts, without include_usage)."""
    extra: dict[str, Any] = {"stream": True, "max_tokens": 8}
    if usage:
        extra["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", r.url + "/v1/chat/completions", json=_body(content, **extra),
                      headers={FAIRNESS: tenant}, timeout=300) as answer:  # fmt: skip
        assert answer.status_code == 200
        events = [json.loads(x[6:]) for x in answer.iter_lines() if x.startswith("data: {")]
    if usage:
        (last,) = [e["usage"] for e in events if e.get("usage")]
        return last["prompt_tokens"], last["completion_tokens"]
    (timings,) = [e["timings"] for e in events if "timings" in e]
    return timings["prompt_n"] + timings["cache_n"], timings["predicted_n"]


def _cancelled(r: RunnerProcess, tenant: str, content: str) -> int:
    """A stream the client leaves after 2 tokens: the tokens it received."""
    body = _body(content, stream=True, max_tokens=48)
    seen = 0
    with httpx.stream("POST", r.url + "/v1/chat/completions", json=body,
                      headers={FAIRNESS: tenant}, timeout=300) as answer:  # fmt: skip
        assert answer.status_code == 200
        for line in answer.iter_lines():
            seen += '"content":"' in line
            if seen == 2:
                break
    return seen


def _rows(r: RunnerProcess) -> dict[str, dict[str, Any]]:
    doc = httpx.get(r.url + "/v1/usage", headers={FAIRNESS: "alpha"}, timeout=30).json()
    return {row["tenant"]: row for row in doc["data"] if row["model"] == MODEL}


def test_tenant_usage_matches_the_real_engines_figures(runner: RunnerProcess) -> None:
    """Whole and streamed requests (alpha, beta) are billed exactly what llama-server
    reported for them; cancelled streams (gamma) exactly the prompt it counted and at least
    the tokens it generated, at most the documented allowance more each; in all, prompt
    tokens equal the engine's counters and completion tokens are within the allowance."""
    url, key = _engine(runner)
    eventually(lambda: _counters(url, key).get("llamacpp:requests_processing") == 0)
    before = _counters(url, key)
    jobs = [
        ("alpha", lambda: _whole(runner, "alpha", "Name a colour.")),
        ("alpha", lambda: _streamed(runner, "alpha", "Name a fruit.", usage=True)),
        ("alpha", lambda: _streamed(runner, "alpha", "Name a tree.", usage=False)),
        ("beta", lambda: _whole(runner, "beta", "Count to three.")),
        ("beta", lambda: _streamed(runner, "beta", "Name a river.", usage=False)),
        ("gamma", lambda: _cancelled(runner, "gamma", "Tell a long story about a ship.")),
        ("gamma", lambda: _cancelled(runner, "gamma", "Describe the sea at length.")),
    ]
    with ThreadPoolExecutor(3) as pool:  # two slots: some wait, some share the engine
        results = list(pool.map(lambda job: (job[0], job[1]()), jobs))
    engine: dict[str, list[int]] = {"alpha": [0, 0], "beta": [0, 0]}
    for tenant, figures in results:
        if tenant in engine and isinstance(figures, tuple):
            engine[tenant][0] += figures[0]
            engine[tenant][1] += figures[1]
    eventually(lambda: sum(row["requests"] for row in _rows(runner).values()) == len(jobs))
    # the engine counts a task (a cancelled one too) as it releases its slot
    eventually(lambda: _counters(url, key).get("llamacpp:requests_processing") == 0)
    after = _counters(url, key)
    rows = _rows(runner)

    for tenant in ("alpha", "beta"):
        row = rows[tenant]
        assert [row["promptTokens"], row["completionTokens"]] == engine[tenant], tenant
        assert row["requestsByOutcome"]["ok"] == row["requests"]
    assert rows["gamma"]["requestsByOutcome"]["cancelled"] == 2

    def delta(name: str) -> int:
        return round(after[f"llamacpp:{name}"] - before[f"llamacpp:{name}"])

    prompt_engine = delta("prompt_tokens_total") + delta("prompt_tokens_cached_total")
    predicted_engine = delta("tokens_predicted_total")
    billed_prompt = sum(row["promptTokens"] for row in rows.values())
    billed_output = sum(row["completionTokens"] for row in rows.values())
    assert billed_prompt == prompt_engine
    gamma_engine = predicted_engine - sum(engine[t][1] for t in engine)
    assert gamma_engine >= 4  # each cancelled stream made at least the 2 tokens received
    assert 0 <= billed_output - predicted_engine <= 2 * CUT_ALLOWANCE_TOKENS
    assert rows["gamma"]["completionTokens"] >= gamma_engine
