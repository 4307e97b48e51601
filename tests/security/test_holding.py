"""Holding what others need (issue 25, Why 3): one tenant must not keep a slot, the audit
disk, the event loop or the shared Redis from the others."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from tests.fixtures.launch import start_fake
from tests.security.kit import (
    chat,
    comfy_models,
    keyed_runner,
    metric_lines,
    stalled_stream,
    stand_in_models,
)
from tests.support.engines import comfyui_root
from tests.support.poll import eventually
from tests.support.redis_server import RedisServer, running_redis
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)


def test_a_client_that_stops_reading_loses_its_slot(tmp_path: Path) -> None:
    """Attack: a streaming client stops reading and keeps its scheduler slot as long as it
    likes. After WRITE_STALL_TIMEOUT_S without progress the stream is ended, the engine
    request cancelled and the slot released (the next request is served), and the stall is
    counted in quorum_write_stalls_total."""
    models = stand_in_models("llama-server-floods-stream")
    env = {"WRITE_STALL_TIMEOUT_S": "1", "QUEUE_TIMEOUT_MS": "20000", "TENANT_IDENTITY": "open"}
    with start_runner(models_file=models, env=env) as r:
        eventually(
            lambda: httpx.get(r.url + "/v1/capabilities").json()["models"]["loaded"], 30, "load"
        )
        body = orjson.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "flood"}]}
        )
        sock = stalled_stream(r.port, body, "X-Tenant-ID: hog\r\n")
        try:
            served = chat(r.url, {"X-Tenant-ID": "next"})
            assert served.status_code == 200, served.text
        finally:
            sock.close()
        stalls = [line for line in metric_lines(r.url, "quorum_write_stalls_total")]
        assert stalls and float(stalls[0].rsplit(" ", 1)[1]) >= 1, stalls


@pytest.fixture(scope="module")
def governed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunnerProcess, Path]]:
    """A keyed, governed runner writing its audit log to a file; lifecycle calls limited to
    20 per minute per source."""
    tmp = tmp_path_factory.mktemp("governed")
    with keyed_runner(tmp, {"LIFECYCLE_RATE_LIMIT": "20/minute"}) as r:
        yield r, tmp / "audit.jsonl"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines() if path.exists() else []


def test_oversized_lifecycle_body_is_refused_before_it_is_read_or_audited(
    governed: tuple[RunnerProcess, Path],
) -> None:
    """Attack: an unauthenticated `POST /v1/cache/flush` with a big junk body was parsed and
    audited (up to MAX_BODY_BYTES, 8 MiB). Lifecycle bodies above 64 KiB are 413 before
    anything is parsed or audited."""
    r, audit = governed
    before = len(_lines(audit))
    body = json.dumps({"scope": "all", "verifiedOpToken": "A" * (70 * 1024)})
    answer = httpx.post(
        r.url + "/v1/cache/flush", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 413, answer.text
    assert len(_lines(audit)) == before


def test_junk_token_writes_a_small_audit_record(governed: tuple[RunnerProcess, Path]) -> None:
    """Attack: a 16 KiB junk token wrote a 16 KiB fsync'd audit record every time. The
    record of a refused call holds a capped `detail`: under 2 KiB whatever was sent."""
    r, audit = governed
    before = len(_lines(audit))
    junk = {"payload": "x", "signatures": [], "A" * (15 * 1024): 1}  # its name is quoted
    answer = httpx.post(r.url + "/v1/cache/flush", json={"scope": "all", "verifiedOpToken": junk})
    assert answer.status_code in (400, 401), answer.text
    written = _lines(audit)[before:]
    assert written and all(len(line) < 2048 for line in written), [len(x) for x in written]


def test_lifecycle_calls_are_rate_limited_per_source_before_verification(tmp_path: Path) -> None:
    """Attack: junk lifecycle calls as fast as the runner verifies and audits them. Past the
    source's LIFECYCLE_RATE_LIMIT they are 429 with Retry-After, before verification: the
    audit log stops growing."""
    with keyed_runner(tmp_path, {"LIFECYCLE_RATE_LIMIT": "5/minute"}) as r:
        audit = tmp_path / "audit.jsonl"
        answers = [
            httpx.post(r.url + "/v1/cache/flush", json={"scope": "all", "verifiedOpToken": "junk"})
            for _ in range(8)
        ]
        assert all(a.status_code in (400, 401) for a in answers[:5]), answers
        for refused in answers[5:]:
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["retry-after"]) >= 1
        assert len(_lines(audit)) == 5


def test_large_json_bodies_are_parsed_off_the_event_loop() -> None:
    """Attack: a stream of 8 MiB JSON bodies, each parsed on the event loop, stalls every
    other request of the runner meanwhile. Bodies above the threshold are parsed in a
    worker thread; small ones (the data path's) stay on the loop, with no extra await."""
    from runner.http.json_body import OFFLOAD_BYTES, load_json

    offloaded: list[int] = []

    async def offload(parse: Any, body: bytes) -> Any:
        offloaded.append(len(body))
        return await asyncio.to_thread(parse, body)

    big = orjson.dumps({"model": "m", "prompt": "x" * OFFLOAD_BYTES})
    small = orjson.dumps({"model": "m", "prompt": "hi"})
    assert asyncio.run(load_json(big, offload=offload))["model"] == "m"
    assert asyncio.run(load_json(small, offload=offload))["model"] == "m"
    assert offloaded == [len(big)]


@pytest.fixture(scope="module")
def comfy_redis(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunnerProcess, RedisServer]]:
    """An image runner on a real Redis; results above 1 KiB leave Redis, 2 live jobs each."""
    root = tmp_path_factory.mktemp("comfy")
    folder = comfyui_root(root / "ComfyUI")
    with (
        running_redis() as server,
        start_fake(
            "fake_comfyui", "--base-directory", str(folder), "--slow-step-ms", "300"
        ) as comfy,
    ):
        models = comfy_models(comfy.url)
        env = {
            "REDIS_URL": server.url,
            "IMAGES_DIR": str(root / "images"),
            "JOB_RESULT_INLINE_MAX_BYTES": "1024",
            "JOBS_MAX_PER_TENANT": "2",
        }
        with start_runner(models_file=models, env=env, ready_timeout=60) as r:
            yield r, server


def _image_job(url: str, tenant: str, prompt: str = "a kite", n: int = 1) -> httpx.Response:
    return httpx.post(
        url + "/v1/images/generations",
        json={"model": "sd", "prompt": prompt, "size": "256x256", "n": n},
        headers={"X-Tenant-ID": tenant, "Prefer": "respond-async"},
        timeout=30,
    )


def test_async_image_results_are_kept_as_urls_not_in_redis(
    comfy_redis: tuple[RunnerProcess, RedisServer],
) -> None:
    """Attack: async image jobs kept whole `b64_json` results in Redis for 24 h, with no cap:
    a tenant fills the shared Redis (nonces fail, the limiter fails open). A result above
    JOB_RESULT_INLINE_MAX_BYTES is stored as image URLs; Redis holds only the record."""
    r, server = comfy_redis
    accepted = _image_job(r.url, "filler", n=4)
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    job_url = r.url + f"/v1/jobs/{job_id}"

    def done() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(job_url, headers={"X-Tenant-ID": "filler"}).json()
        return doc if doc["status"] in ("succeeded", "failed") else None

    finished = eventually(done, 60, "the job")
    assert finished["status"] == "succeeded", finished
    item = finished["result"]["data"][0]
    assert "url" in item and "b64_json" not in item, list(item)
    image = httpx.get(item["url"])
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    stored = redis.Redis.from_url(server.url).get(f"quorum:job:{job_id}")
    assert stored is not None and len(stored) < 2048, len(stored or b"")


def test_live_jobs_are_capped_per_tenant(comfy_redis: tuple[RunnerProcess, RedisServer]) -> None:
    """Attack: one tenant submits jobs without end, each a record (and soon a result) in the
    shared store. Past JOBS_MAX_PER_TENANT live jobs it gets 429 too_many_jobs with
    Retry-After; another tenant is still accepted."""
    r, _ = comfy_redis
    held = [_image_job(r.url, "greedy", "[fake:slow] a slow kite") for _ in range(2)]
    assert [h.status_code for h in held] == [202, 202], [h.text for h in held]
    third = _image_job(r.url, "greedy")
    assert third.status_code == 429, third.text
    assert third.json()["error"]["code"] == "too_many_jobs"
    assert int(third.headers["retry-after"]) >= 1
    assert _image_job(r.url, "modest").status_code == 202
