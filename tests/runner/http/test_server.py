"""The runner process itself: start-up refusal, graceful SIGTERM."""

from __future__ import annotations

import signal

import httpx

from tests.fixtures.launch import start_fake
from tests.support import forkserver
from tests.support.runner_proc import start_runner


def test_sigterm_during_stream_completes_it_and_exits_zero() -> None:
    """SIGTERM while a response streams: the stream finishes with [DONE] and the exit code is 0."""
    with (
        start_fake(
            "fake_openai", "--latency-ms", "0", "--chunks", "20", "--chunk-delay-ms", "50"
        ) as engine,
        start_runner({"echo": engine.url}) as runner,
        httpx.Client(base_url=runner.url, timeout=20) as client,
    ):
        body = {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            chunks = r.iter_raw()
            first = next(chunks)
            assert first
            runner.proc.send_signal(signal.SIGTERM)
            rest = b"".join(chunks)
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert (first + rest).count(b'"tok') == 20
        assert runner.proc.wait(20) == 0


def test_sigterm_when_idle_exits_zero() -> None:
    """An idle runner stops at once on SIGTERM with exit code 0."""
    with start_runner({}) as runner:
        assert runner.terminate() == 0


def test_invalid_setting_refuses_start_naming_variable() -> None:
    """An invalid environment variable stops start-up with a message naming it."""
    env = {"MAX_QUEUE_DEPTH": "lots", "PATH": "/usr/bin:/bin"}
    proc = forkserver.run("runner", env=env, timeout=30)
    assert proc.returncode == 2
    assert b"MAX_QUEUE_DEPTH" in proc.stderr


def test_bad_models_file_refuses_start_naming_it(tmp_path: object) -> None:
    """A models file with an entry missing its url stops start-up naming MODELS_CONFIG."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - id: a\n    backend: openai\n")
    proc = forkserver.run(
        "runner", env={"MODELS_CONFIG": str(path), "PATH": "/usr/bin:/bin"}, timeout=30
    )
    assert proc.returncode == 2
    assert b"MODELS_CONFIG" in proc.stderr and b"url" in proc.stderr


def test_metrics_port_serves_metrics_too() -> None:
    """METRICS_PORT exposes both metrics paths on a second port: /metrics the runner's own
    series (queue depth included, no `vllm:*`), /metrics/picker the endpoint picker's."""
    from tests.support.ports import free_port

    port = free_port()
    with start_runner({}, env={"METRICS_PORT": str(port)}) as runner:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'quorum_queue_depth{priority="high"} 0.0' in text
        assert "vllm:" not in text
        picker = httpx.get(f"http://127.0.0.1:{port}/metrics/picker", timeout=5).text
        assert "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0" in picker
        assert "quorum_" not in picker
        assert httpx.get(runner.url + "/metrics").status_code == 200


def test_metrics_disabled_answers_503() -> None:
    """ENABLE_METRICS=false turns /metrics and /metrics/picker off with a clear error."""
    with start_runner({}, env={"ENABLE_METRICS": "false"}) as runner:
        for path in ("/metrics", "/metrics/picker"):
            r = httpx.get(runner.url + path)
            assert r.status_code == 503
            assert "ENABLE_METRICS" in r.json()["error"]["message"]
