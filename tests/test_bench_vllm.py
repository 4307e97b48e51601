"""bench/vllm/run.py's report: a run that finished no request is said so, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from bench.vllm import run

pytestmark = pytest.mark.timeout(30)


def _run(requests: int, ttft: list[float]) -> dict[str, Any]:
    return {"rps": requests / 60, "requests": requests, "errors": 16 - requests, "ttft_ms": ttft}


def test_bench_vllm_report_says_no_request_finished() -> None:
    """16 clients on the CPU build that finished nothing on either side: each measure
    reads "no request finished" instead of raising."""
    empty = {"runner": _run(0, []), "direct": _run(0, [])}
    table = run.report({"throughput": {"16": [empty, empty]}})
    assert table.count(run.NONE_FINISHED) == 9  # 3 measures x (ratio, runner, direct)


def test_bench_vllm_report_compares_only_pairs_that_finished() -> None:
    """A pair whose direct side finished nothing is left out of the ratios; the others
    are compared as before."""
    done = {"runner": _run(60, [100.0, 200.0]), "direct": _run(120, [100.0, 100.0])}
    half = {"runner": _run(60, [100.0]), "direct": _run(0, [])}
    table = run.report({"throughput": {"4": [done, half]}})
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert "0.500 [0.500, 0.500]" in rows["| throughput, 4 clients (req/s)"]
    assert run.NONE_FINISHED not in rows["| throughput, 4 clients (req/s)"]


def test_bench_vllm_runs_a_minute_a_side_by_default() -> None:
    """Each side of a pair runs 60 s unless told otherwise (P13 needs runs that long)."""
    assert run.parser().parse_args([]).duration >= 60


def test_bench_vllm_measures_json_answers_beside_streams() -> None:
    """Both streamed and JSON chats by default (P13 asks for both); a JSON case's rows
    read its whole-answer latency, not a TTFT."""
    assert run.parser().parse_args([]).modes.split(",") == ["stream", "json"]
    pair = {"runner": _run(60, [100.0]), "direct": _run(60, [100.0])}
    table = run.report({"throughput": {"4": [pair], "4 JSON": [pair]}})
    assert "| latency p50, 4 JSON clients (ms) | 1.000" in table
    assert "| TTFT p50, 4 clients (ms) | 1.000" in table
