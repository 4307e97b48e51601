"""Embeddings are bounded, sent and charged input by input (issue 36, item 7): through a
real runner in front of the fake llama-server (attached by URL), a tenant with an input
token budget."""

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

BUDGET = 100_000  # input tokens per hour
KEY = "embed-key-0123456789abcdef0123456789abcdef"
PER_INPUT = 8  # runner/tenancy/guard.py EMBEDDING_TOKENS_PER_INPUT
PATH = "/v1/embeddings"


@dataclass
class Setup:
    runner: RunnerProcess
    engine: FakeEngine


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder: Path = tmp_path_factory.mktemp("embeddings")
    digest = "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()
    (folder / "tenants.yaml").write_text(
        "tenants:\n  embed:\n"
        f'    api_keys: ["{digest}"]\n'
        f"    token_budgets: [{{tokens: {BUDGET}, per: hour, count: input}}]\n"
    )
    with start_fake("fake_openai", "--latency-ms", "0") as engine:
        models = f"models:\n  - {{id: m, backend: llama-server, url: '{engine.url}'}}\n"
        env = {"TENANTS_FILE": str(folder / "tenants.yaml")}
        with start_runner(models_file=models, env=env) as runner:
            yield Setup(runner, engine)


def _post(s: Setup, value: object) -> httpx.Response:
    s.engine.reset()
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "m", "input": value}
    return httpx.post(s.runner.url + PATH, json=body, headers=auth, timeout=30)


def _charged(s: Setup) -> int:
    auth = {"Authorization": f"Bearer {KEY}"}
    rows = httpx.get(s.runner.url + "/v1/usage", headers=auth, timeout=10).json()["data"]
    return sum(int(row["promptTokens"]) for row in rows)


@pytest.mark.parametrize(
    ("value", "bound"),
    [
        (["one two", "three", "ß"], (7 + PER_INPUT) + (5 + PER_INPUT) + (2 + PER_INPUT)),
        ("one two three", 13 + PER_INPUT),
        ([[1, 2, 3], [4, 5]], (3 + PER_INPUT) + (2 + PER_INPUT)),
        ([7, 8, 9, 10], 4 + PER_INPUT),
    ],
)
def test_embeddings_reserve_per_input_and_charge_the_engines_sum(
    setup: Setup, value: Any, bound: int
) -> None:
    """An embeddings `input` reserves each input's bytes (a token list: its length) plus
    the per-input special-token allowance, reaches the engine as sent, and is charged the
    engine's own prompt tokens (its sum over the inputs)."""
    before = _charged(setup)
    answer = _post(setup, value)
    assert answer.status_code == 200, answer.text
    left = int(answer.headers["x-ratelimit-remaining-tokens"])
    assert BUDGET - before - left == bound
    assert setup.engine.bodies(PATH)[-1]["input"] == value
    data = answer.json()
    inputs = 1 if isinstance(value, str) or isinstance(value[0], int) else len(value)
    assert len(data["data"]) == inputs
    assert _charged(setup) - before == data["usage"]["prompt_tokens"] <= bound


@pytest.mark.parametrize(
    "value",
    [
        {"prompt_string": "a picture", "multimodal_data": ["aGVsbG8="]},
        [{"prompt_string": "a picture", "multimodal_data": ["aGVsbG8="]}],
        ["some text", [1, 2, 3]],
        [12, 34, "text", 56],
        [[1, 2], []],
        [],
        ["x"] * 2049,
    ],
)
def test_embeddings_inputs_outside_openais_shapes_are_refused(setup: Setup, value: Any) -> None:
    """An `input` that is not a string, a list of strings, a list of token ids or a list
    of token-id lists (llama-server's multimodal objects, mixed lists it reads as one
    prompt), or that holds more than 2048 inputs, is refused 400 `invalid_request` naming
    `input`, and never reaches the engine."""
    answer = _post(setup, value)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == "input", error
    assert setup.engine.received(PATH) == 0
