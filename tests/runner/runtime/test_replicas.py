"""Three runner replicas on one real Redis (issue 18, item 6), every store.

Three `python -m runner` processes (`replica-a`, `-b`, `-c`) share one redis-server that
keeps an append-only file, as the deployments' Redis does. Each serves `m` (a stand-in
llama-server, preloaded), can load `slow` (3 s to load) and `quick`, and draws images on
one fake ComfyUI (`sd`). Tokens are addressed to the replica they are sent to (`aud`).
The two Redis tests run last: they stop and restart the shared server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from runner.memory.leases import DEFAULT_PREFIX as LEASE_PREFIX
from tests.fixtures.launch import start_fake
from tests.support.engines import CHECKPOINT, GOVERNED, comfyui_root
from tests.support.fleet import entry, loaded, loading
from tests.support.poll import eventually
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started
from tests.support.tokens import dev_token

pytestmark = pytest.mark.timeout(120)

IDS = ("replica-a", "replica-b", "replica-c")
# Day-long windows: a test never sees one slide (a weighted previous window would let one more in).
LIMITS = {
    "TENANT_RATE_LIMIT_metered": "6req/day",
    "TENANT_RATE_LIMIT_steady": "4req/day",
    "TENANT_RATE_LIMIT_outage": "1req/day",
    "TENANT_RATE_LIMIT_probe": "1000req/day",
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ENDED = ("completed", "failed", "cancelled", "succeeded")


@dataclass
class Fleet:
    redis: RedisServer
    replicas: dict[str, RunnerProcess]

    def url(self, runner_id: str) -> str:
        return self.replicas[runner_id].url

    def redis_keys(self) -> list[str]:
        client = redis.Redis(port=self.redis.port)
        try:
            return sorted(k.decode() for k in client.scan_iter(count=1000))
        finally:
            client.close()

    def raw(self, key: str) -> bytes | None:
        client = redis.Redis(port=self.redis.port)
        try:
            if client.type(key) != b"string":  # hashes, sets: the tenants' shared tallies
                return None
            value = client.get(key)
            return value if isinstance(value, bytes) else None
        finally:
            client.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Redis (append-only), one fake ComfyUI and three runners on them, each with `m`
    loaded; everything stopped at the end of the module."""
    root = tmp_path_factory.mktemp("replicas")
    folder = comfyui_root(root / "ComfyUI")
    server = RedisServer(appendonly=True).start()
    with ExitStack() as stack:
        stack.callback(server.stop)
        comfy = stack.enter_context(
            start_fake("fake_comfyui", "--base-directory", str(folder), "--slow-step-ms", "300")
        )
        models = (
            "models:\n"
            + entry("m", "llama-server-ok", preload=True)
            + entry("slow", "llama-server-slow")
            + entry("quick", "llama-server-ok")
            + f"  - {{id: sd, backend: comfyui, url: '{comfy.url}', checkpoint: {CHECKPOINT}}}\n"
        )
        replicas = {}
        for runner_id in IDS:  # started together: each waits for Redis, not for the others
            env = {
                **GOVERNED,
                **LIMITS,
                "REDIS_URL": server.url,
                "RUNNER_ID": runner_id,
                "COMFYUI_PATH": str(folder),
                "IMAGES_DIR": str(root / runner_id / "images"),
            }
            replicas[runner_id] = stack.enter_context(
                start_runner(models_file=models, env=env, wait_ready=False)
            )
        for r in replicas.values():
            wait_started(r, timeout=60)
            eventually(lambda r=r: "m" in loaded(r), timeout=60)  # type: ignore[misc]
        yield Fleet(server, replicas)


# -- helpers ---------------------------------------------------------------------------


def _load(url: str, runner_id: str, model: str) -> httpx.Response:
    token = dev_token("model-load", model, {}, aud=runner_id)
    return httpx.post(
        url + "/v1/models/load", json={"modelId": model, "verifiedOpToken": token}, timeout=30
    )


def _started(load: httpx.Response) -> str:
    """The task id of a load that started (202), or a failure that shows the answer."""
    assert load.status_code == 202, (load.status_code, load.text)
    task_id: str = load.json()["taskId"]
    return task_id


def _cancel(url: str, runner_id: str, task_id: str, model: str) -> httpx.Response:
    token = dev_token("task-cancel", model, {"taskId": task_id}, aud=runner_id)
    return httpx.request(
        "DELETE", f"{url}/v1/models/load/{task_id}", json={"verifiedOpToken": token}, timeout=30
    )


def _flush(url: str, token: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        url + "/v1/cache/flush", json={"scope": "all", "verifiedOpToken": token}, timeout=30
    )


def _flush_token(runner_id: str) -> dict[str, Any]:
    return dev_token("cache-flush", None, {"scope": "all"}, aud=runner_id)


def _task(url: str, task_id: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/models/load/{task_id}", timeout=10)


def _ended_task(url: str, task_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = _task(url, task_id).json()
        return doc if doc["status"] in ENDED else None

    result: dict[str, Any] = eventually(ended, 30, f"task {task_id} ended")
    return result


def _image_job(url: str, prompt: str, tenant: str) -> dict[str, Any]:
    r = httpx.post(
        url + "/v1/images/generations",
        json={"model": "sd", "size": "64x64", "prompt": prompt},
        headers={"X-Tenant-ID": tenant, "Prefer": "respond-async"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()
    return job


def _job(url: str, job_id: str, tenant: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/jobs/{job_id}", headers={"X-Tenant-ID": tenant}, timeout=10)


def _ended_job(url: str, job_id: str, tenant: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = _job(url, job_id, tenant).json()
        return doc if doc["status"] in ENDED else None

    result: dict[str, Any] = eventually(ended, 60, f"job {job_id} ended")
    return result


def _chat(url: str, tenant: str) -> int:
    r = httpx.post(
        url + "/v1/chat/completions", json=CHAT, headers={"X-Tenant-ID": tenant}, timeout=30
    )
    return r.status_code


def _jobs_succeeded(url: str) -> float:
    """`quorum_jobs_total{kind="image_generation",outcome="succeeded"}` of one replica."""
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        labels = 'outcome="succeeded"' in line and 'kind="image_generation"' in line
        if line.startswith("quorum_jobs_total{") and labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _lease_holders(fleet: Fleet) -> set[str]:
    """Who holds memory leases in Redis: `<runner>/<model>`, as every replica reads them
    (the snapshot refresh writes its own and reads all, every 5 s)."""
    return {k.rsplit(":", 1)[1] for k in fleet.redis_keys() if k.startswith(LEASE_PREFIX)}


def _record_owner(raw: bytes | None) -> object:
    """The `runner_id` a JSON record names (a task's or a job's), else None."""
    try:
        record = json.loads(raw or b"")
    except ValueError:
        return None
    return record.get("runner_id") if isinstance(record, dict) else None


def _limiter_back(url: str) -> bool:
    """Whether the replica's rate limiter decides with Redis again: after an outage it
    tries Redis at most once a second, failing open in between (no RateLimit headers)."""
    r = httpx.post(
        url + "/v1/chat/completions", json=CHAT, headers={"X-Tenant-ID": "probe"}, timeout=30
    )
    return r.status_code == 200 and "ratelimit-limit" in r.headers


def _code(r: httpx.Response) -> str:
    code: str = r.json()["error"]["code"]
    return code


# -- the tests -------------------------------------------------------------------------


@pytest.mark.parametrize("canceller", ["replica-b", "replica-c"])
def test_replicas_load_task_read_and_cancelled_from_any_replica(
    fleet: Fleet, canceller: str
) -> None:
    """A load started on replica A is read from B and C and cancelled from either (a
    token addressed to that replica): every replica then reads it cancelled, and A
    does not keep the model."""
    a = fleet.url("replica-a")
    task_id = _started(_load(a, "replica-a", "slow"))
    for other in ("replica-b", "replica-c"):
        seen = _task(fleet.url(other), task_id).json()
        assert seen["taskId"] == task_id and seen["status"] in ("queued", "loading"), seen
    r = _cancel(fleet.url(canceller), canceller, task_id, "slow")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    for runner_id in IDS:
        assert _task(fleet.url(runner_id), task_id).json()["status"] == "cancelled"
    runner_a = fleet.replicas["replica-a"]
    eventually(lambda: "slow" not in loading(runner_a), timeout=30)
    assert "slow" not in loaded(runner_a)
    assert _task(a, task_id).json()["status"] == "cancelled"


def test_replicas_load_of_one_model_on_two_replicas_loads_each(fleet: Fleet) -> None:
    """Replicas hold their own models: a load of `quick` on B while A loads it gives B a
    task of its own and B the model (a load on one replica never joins another's)."""
    a, b = fleet.url("replica-a"), fleet.url("replica-b")
    first = _load(a, "replica-a", "quick")
    second = _load(b, "replica-b", "quick")
    assert first.status_code == second.status_code == 202, (first.text, second.text)
    assert first.json()["taskId"] != second.json()["taskId"]
    for url, task in ((a, first), (b, second)):
        assert _ended_task(url, task.json()["taskId"])["status"] == "completed"
    assert "quick" in loaded(fleet.replicas["replica-a"])
    assert "quick" in loaded(fleet.replicas["replica-b"])


@pytest.mark.parametrize("canceller", ["replica-b", "replica-c"])
def test_replicas_job_read_and_cancelled_from_any_replica(fleet: Fleet, canceller: str) -> None:
    """An image job created on A is read from B and C by its tenant (404 to another
    tenant, who cannot cancel it either), and cancelled from B or C: 202, then every
    replica reads it cancelled."""
    a = fleet.url("replica-a")
    job = _image_job(a, "[fake:slow] a kite far away", tenant="jobs")
    for other in ("replica-b", "replica-c"):
        seen = _job(fleet.url(other), job["id"], "jobs")
        assert seen.status_code == 200 and seen.json()["id"] == job["id"], seen.text
        assert _job(fleet.url(other), job["id"], "intruder").status_code == 404
    url = f"{fleet.url(canceller)}/v1/jobs/{job['id']}"
    assert httpx.delete(url, headers={"X-Tenant-ID": "intruder"}).status_code == 404
    r = httpx.delete(url, headers={"X-Tenant-ID": "jobs"}, timeout=10)
    assert r.status_code == 202, r.text
    assert _ended_job(fleet.url(canceller), job["id"], "jobs")["status"] == "cancelled"
    for runner_id in IDS:
        assert _job(fleet.url(runner_id), job["id"], "jobs").json()["status"] == "cancelled"


def test_replicas_nonces_and_rate_limits_shared(fleet: Fleet) -> None:
    """A spent token is refused everywhere: 409 on its replica, 403 on the others (it is
    addressed to A); a tenant's 6 requests a day are counted once across replicas."""
    token = _flush_token("replica-a")
    assert _flush(fleet.url("replica-a"), token).status_code == 200
    for other in ("replica-b", "replica-c"):
        assert _flush(fleet.url(other), token).status_code == 403
    assert _flush(fleet.url("replica-a"), token).status_code == 409
    spent = [_chat(fleet.url(runner_id), "metered") for runner_id in IDS for _ in range(2)]
    assert spent == [200] * 6
    assert [_chat(fleet.url(runner_id), "metered") for runner_id in IDS] == [429] * 3


def test_replicas_leases_shared_and_keys_name_their_runner(fleet: Fleet) -> None:
    """Each replica's memory leases are in Redis for every replica to read, and every key
    the runners write, while a load and a job run, names its runner (in the key or, for a
    record any replica reads by id, in the record) unless it is one of the fleet's
    shared keys (nonces, rate windows, the active-task set, a job's cancel request, and
    the tenants' policies, budgets, in-flight permits and usage, which are one per fleet)."""
    eventually(lambda: {f"{runner_id}/m" for runner_id in IDS} <= _lease_holders(fleet))
    a, c = fleet.url("replica-a"), fleet.url("replica-c")
    task_id = _started(_load(a, "replica-a", "slow"))
    job = _image_job(c, "[fake:slow] a kite for the keys", tenant="keys")
    eventually(lambda: _job(c, job["id"], "keys").json()["status"] == "running")
    flushed = _flush(a, _flush_token("replica-a"))
    assert flushed.status_code == 200, flushed.text
    assert _chat(a, "probe") == 200
    try:
        keys = fleet.redis_keys()
        assert "quorum:task:model:replica-a:slow" in keys, keys
        assert "quorum:job:runner:replica-c" in keys, keys
        shared = (
            "quorum:gov:nonce:",
            "quorum:{LIMITER/",
            "quorum:task:active",
            "quorum:tenants:",
            "quorum:budget:",
            "quorum:inflight:",
            "quorum:usage:",
        )
        assert {k for k in keys if k.startswith(shared[:2])}, keys
        unnamed = [
            key
            for key in keys
            if not any(runner_id in key for runner_id in IDS)
            and not key.startswith(shared)
            and not (key.startswith("quorum:job:") and key.endswith(":cancel"))
            and _record_owner(fleet.raw(key)) not in IDS  # a task's or a job's record
        ]
        assert unnamed == []
    finally:
        _cancel(a, "replica-a", task_id, "slow")
        httpx.delete(f"{c}/v1/jobs/{job['id']}", headers={"X-Tenant-ID": "keys"}, timeout=10)


def test_replicas_redis_down_fails_closed_and_serves_open(fleet: Fleet) -> None:
    """Redis stopped: every replica refuses governed calls (503 `nonce_store_unavailable`)
    and reads of tasks and jobs (503), and serves inference unlimited
    (`RATE_LIMIT_FAIL_OPEN`'s default); once it is back, every replica governs again."""
    load = _load(fleet.url("replica-a"), "replica-a", "quick")
    assert load.status_code in (200, 202), load.text
    task_id = load.json()["taskId"]
    job = _image_job(fleet.url("replica-b"), "a kite", tenant="painter")
    assert [_chat(fleet.url(runner_id), "outage") for runner_id in IDS] == [200, 429, 429]
    fleet.redis.stop(keep_data=True)
    try:
        for runner_id in IDS:
            url = fleet.url(runner_id)
            r = _flush(url, _flush_token(runner_id))
            assert r.status_code == 503 and _code(r) == "nonce_store_unavailable", r.text
            r = _load(url, runner_id, "quick")
            assert r.status_code == 503 and _code(r) == "nonce_store_unavailable", r.text
            r = _task(url, task_id)
            assert r.status_code == 503 and _code(r) == "task_store_unavailable", r.text
            r = _job(url, job["id"], "painter")
            assert r.status_code == 503 and _code(r) == "job_store_unavailable", r.text
            assert [_chat(url, "outage") for _ in range(3)] == [200] * 3  # spent, yet served
    finally:
        fleet.redis.start()
    for url in (fleet.url(runner_id) for runner_id in IDS):
        eventually(lambda url=url: _limiter_back(url), what="the limiter back")
    for runner_id in IDS:
        flushed = _flush(fleet.url(runner_id), _flush_token(runner_id))
        assert flushed.status_code == 200, (runner_id, flushed.text)
    assert [_chat(fleet.url(runner_id), "outage") for runner_id in IDS] == [429] * 3


def test_replicas_redis_restart_keeps_and_completes_records(fleet: Fleet) -> None:
    """Redis restarted on its append-only file: tasks, jobs, spent nonces and rate windows
    read as before the outage (nothing counted twice, nothing served during it counted);
    a load and a job that ended during the outage read as they ended, on every replica,
    once Redis is back."""
    a, b, c = (fleet.url(runner_id) for runner_id in IDS)
    task = _ended_task(b, _started(_load(b, "replica-b", "slow")))
    job = _ended_job(c, _image_job(c, "a kite before", tenant="painter")["id"], "painter")
    assert (task["status"], job["status"]) == ("completed", "succeeded"), (task, job)
    spent = _flush_token("replica-a")
    flushed = _flush(a, spent)
    assert flushed.status_code == 200, flushed.text
    assert [_chat(url, "steady") for url in (a, b)] == [200, 200]
    slow_load = _started(_load(a, "replica-a", "slow"))  # 3 s: ends during the outage
    slow_job = _image_job(b, "[fake:slow] a kite during", tenant="painter")["id"]  # 6 s
    eventually(lambda: _job(c, slow_job, "painter").json()["status"] == "running")
    jobs_done = _jobs_succeeded(b)

    fleet.redis.stop(keep_data=True)
    try:
        assert [_chat(url, "steady") for url in (a, b, c)] == [200] * 3  # not counted
        eventually(lambda: "slow" in loaded(fleet.replicas["replica-a"]), timeout=30)
        eventually(lambda: _jobs_succeeded(b) > jobs_done, timeout=30)
    finally:
        fleet.redis.start()
    for url in (fleet.url(runner_id) for runner_id in IDS):
        eventually(lambda url=url: _limiter_back(url), what="the limiter back")

    for url in (a, b, c):
        assert _task(url, task["taskId"]).json() == task
        again = _job(url, job["id"], "painter").json()
        assert "status" in again, again
        assert (again["status"], again["finished_at"]) == ("succeeded", job["finished_at"])
    assert _flush(a, spent).status_code == 409
    assert [_chat(url, "steady") for url in (a, b, c)] == [200, 200, 429]
    for url in (a, b, c):
        assert _ended_task(url, slow_load)["status"] == "completed"
        assert _ended_job(url, slow_job, "painter")["status"] == "succeeded"
    eventually(lambda: {f"{r}/m" for r in IDS} <= _lease_holders(fleet), timeout=20)
