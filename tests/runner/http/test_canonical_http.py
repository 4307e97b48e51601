"""What runs is what was reserved and charged: the attacks of issue 36 through a real runner
in front of the fake llama-server (attached by URL as kind `llama-server`; the fake runs
`n_cmpl` x prompts completions and reports one in `usage`, as the real one does, and counts
every completion's tokens in `tokens_predicted_total`).

Each attack holds the same two invariants: the engine generated no more output tokens
than the request reserved in the tenant's output budget, nor more than it was charged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(90)

BUDGET = 5000  # output tokens per hour, each tenant's only budget
WORDS = " ".join(f"w{i}" for i in range(60))  # the fake echoes them: 61 output tokens
TENANTS = ("plain", "ncmpl", "lists", "npredict", "vllmish")


def _key(tenant: str) -> str:
    return f"{tenant}-key-0123456789abcdef0123456789abcdef"


def _tenants() -> str:
    lines = ["tenants:"]
    for t in TENANTS:
        digest = "sha256:" + hashlib.sha256(_key(t).encode()).hexdigest()
        lines += [
            f"  {t}:",
            f'    api_keys: ["{digest}"]',
            f"    token_budgets: [{{tokens: {BUDGET}, per: hour, count: output}}]",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Setup:
    runner: RunnerProcess
    engine: FakeEngine


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder: Path = tmp_path_factory.mktemp("canonical")
    (folder / "tenants.yaml").write_text(_tenants())
    with start_fake("fake_openai", "--latency-ms", "0", "--chunks", "6") as engine:
        models = f"models:\n  - {{id: m, backend: llama-server, url: '{engine.url}'}}\n"
        env = {"TENANTS_FILE": str(folder / "tenants.yaml")}
        with start_runner(models_file=models, env=env) as runner:
            yield Setup(runner, engine)


@dataclass
class Outcome:
    answer: httpx.Response
    generated: int  # the engine's own count, every completion
    reserved: int  # output tokens the request reserved (its budget headers)
    charged: int  # output tokens the tenant was charged (/v1/usage)


def _send(s: Setup, tenant: str, path: str, body: dict[str, Any]) -> Outcome:
    s.engine.reset()
    auth = {"Authorization": f"Bearer {_key(tenant)}"}
    answer = httpx.post(s.runner.url + path, json={"model": "m", **body}, headers=auth, timeout=30)
    left = int(answer.headers.get("x-ratelimit-remaining-tokens", BUDGET))
    usage = httpx.get(s.runner.url + "/v1/usage", headers=auth, timeout=10).json()["data"]
    charged = sum(row["completionTokens"] for row in usage)
    generated = int(s.engine.stats()["tokens_predicted_total"])
    return Outcome(answer, generated, BUDGET - left, charged)


def _holds(outcome: Outcome) -> None:
    assert outcome.generated <= outcome.reserved, (outcome.generated, outcome.reserved)
    assert outcome.generated <= outcome.charged, (outcome.generated, outcome.charged)


def _refused(outcome: Outcome, param: str) -> None:
    assert outcome.answer.status_code == 400, outcome.answer.text
    error = outcome.answer.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == param, error


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": WORDS}], **extra}


def test_canonical_http_n_cmpl_cannot_run_unreserved_completions(setup: Setup) -> None:
    """`n_cmpl: 2` with `max_tokens: 40` (llama-server's own `n`): never two completions
    charged as one; refused 400 unsupported_parameter naming `n_cmpl`."""
    outcome = _send(setup, "ncmpl", "/v1/chat/completions", _chat(n_cmpl=2, max_tokens=40))
    _holds(outcome)
    _refused(outcome, "n_cmpl")


def test_canonical_http_prompt_list_times_n_cmpl_is_refused(setup: Setup) -> None:
    """A completions `prompt` list of 2 with `n_cmpl: 2` (four completions): never charged
    as one; refused 400 unsupported_parameter (the list is checked first: `prompt`)."""
    body = {"prompt": [WORDS, WORDS], "n_cmpl": 2, "max_tokens": 10}
    outcome = _send(setup, "lists", "/v1/completions", body)
    _holds(outcome)
    assert outcome.answer.status_code == 400, outcome.answer.text
    assert outcome.answer.json()["error"]["code"] == "unsupported_parameter"


def test_canonical_http_n_predict_cannot_outrun_max_tokens(setup: Setup) -> None:
    """`max_tokens: 1` with `n_predict: -1` (llama-server reads `n_predict` first): never
    more generated than the one token reserved; refused 400 naming `n_predict`."""
    outcome = _send(setup, "npredict", "/v1/chat/completions", _chat(max_tokens=1, n_predict=-1))
    _holds(outcome)
    assert outcome.answer.status_code == 400, outcome.answer.text
    assert outcome.answer.json()["error"]["param"] == "n_predict"


def test_canonical_http_other_kinds_fields_are_refused_by_name(setup: Setup) -> None:
    """A field neither OpenAI's nor llama-server's (vLLM's `best_of` on chat, a made-up
    one) is 400 unsupported_parameter naming it; nothing reaches the engine."""
    for field, value in (("best_of", 2), ("use_beam_search", True), ("x-y", 1)):
        outcome = _send(setup, "vllmish", "/v1/chat/completions", _chat(**{field: value}))
        _refused(outcome, field)
        assert setup.engine.stats()["by_path"].get("/v1/chat/completions", 0) == 0


def test_canonical_http_plain_requests_are_unchanged(setup: Setup) -> None:
    """Plain OpenAI requests (chat, one-prompt completions, a stream, llama-server's
    sampling extras, `n: 1`) are served as before: the engine gets every field as sent and
    generates what was reserved and charged."""
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", _chat(max_tokens=5, temperature=0.5, n=1, top_k=40)),
        ("/v1/completions", {"prompt": WORDS, "max_tokens": 4, "seed": 7}),
        ("/v1/completions", {"prompt": [WORDS], "max_tokens": 3}),
        ("/v1/chat/completions", _chat(max_tokens=6, n_predict=6)),
        ("/v1/chat/completions", _chat(stream=True, max_tokens=3)),
    ]
    charged = 0
    for path, body in bodies:
        outcome = _send(setup, "plain", path, body)
        assert outcome.answer.status_code == 200, outcome.answer.text
        assert outcome.generated <= outcome.reserved
        assert outcome.charged - charged == outcome.generated
        charged = outcome.charged
        sent = setup.engine.stats()["last_body"]
        assert {k: sent.get(k) for k in body} == body


def test_canonical_http_pass_through_is_one_models_own(tmp_path: Path) -> None:
    """A field the models file passes through for one model (`pass_through`) reaches its
    engine as sent; on another model of the same kind it stays 400
    unsupported_parameter naming it."""
    with start_fake("fake_openai", "--latency-ms", "0") as engine:
        models = (
            "models:\n"
            f"  - {{id: open, backend: llama-server, url: '{engine.url}',"
            " pass_through: [speculative.n_max]}\n"
            f"  - {{id: closed, backend: llama-server, url: '{engine.url}'}}\n"
        )
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        body["speculative.n_max"] = 4
        with start_runner(models_file=models) as runner:
            url = runner.url + "/v1/chat/completions"
            served = httpx.post(url, json={**body, "model": "open"}, timeout=30)
            assert served.status_code == 200, served.text
            assert engine.stats()["last_body"]["speculative.n_max"] == 4
            refused = httpx.post(url, json={**body, "model": "closed"}, timeout=30)
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["param"]) == ("unsupported_parameter", "speculative.n_max")
