"""The doors issue 38 found ajar: an oracle before approval on the governed routes, gateway
identity without proof, lock-outs by someone else's failures, one address starving the
rest, a thread per half-sent request on the metrics port, adapters shown to every caller,
the `high` priority for the asking, and engines that inherited the runner's secrets. One
test per attack; each failed on `f34d4e0`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.kit import (
    KEYS,
    SHARED_SECRET,
    basic,
    bearer,
    chat,
    engine_pids,
    keyed_runner,
    stand_in_models,
    start_refused,
    wait_loaded,
)
from tests.support.engines import process_env
from tests.support.fleet import entry
from tests.support.poll import eventually
from tests.support.ports import free_port
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

FAIRNESS = "x-llm-d-inference-fairness-id"
ELSEWHERE = "127.0.0.2"
"""Another source address on the loopback network (Linux routes all of 127/8 there)."""


@pytest.fixture(scope="module")
def governed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    """A keyed, governed runner whose auth-failure throttle is far away."""
    tmp = tmp_path_factory.mktemp("governed")
    env = {"AUTH_FAILURE_SOURCE_LIMIT": "1000/minute", "LIFECYCLE_RATE_LIMIT": "1000/minute"}
    with keyed_runner(tmp, env) as r:
        yield r


def elsewhere() -> httpx.Client:
    """A client connecting from ELSEWHERE."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=ELSEWHERE), timeout=30)


def test_tenant_policy_before_approval_is_no_key_or_tenant_oracle(
    governed: RunnerProcess,
) -> None:
    """Attack: `PUT /v1/tenants/{id}` without a token, its policy listing another tenant's
    key digest, answered 400 naming that tenant and the tenants file: a key bisected in a
    dozen requests. Before approval only syntax is checked: the answer is the gate's (401),
    the same for a digest nobody holds, naming no tenant and no file."""
    digest = "sha256:" + hashlib.sha256(KEYS["acme"].encode()).hexdigest()
    answers = []
    for key in (digest, "sha256:" + "0" * 64):
        policy = {"api_keys": [key]}
        answers.append(httpx.put(governed.url + "/v1/tenants/evil", json={"policy": policy}))
    held, unheld = answers
    assert held.status_code == unheld.status_code == 401, held.text
    assert held.json()["error"] == unheld.json()["error"]
    assert "acme" not in held.text and "tenants.yaml" not in held.text


def test_tenant_delete_before_approval_tells_no_tenant_from_a_missing_one(
    governed: RunnerProcess,
) -> None:
    """Attack: `DELETE /v1/tenants/{id}` answered 404 for a tenant that does not exist and
    401 for one that does: the tenants enumerated without a token. Both answer alike."""
    exists = httpx.delete(governed.url + "/v1/tenants/acme")
    missing = httpx.delete(governed.url + "/v1/tenants/nobody-here")
    assert exists.status_code == missing.status_code == 401, missing.text
    assert exists.json()["error"] == missing.json()["error"]


def test_adapter_load_before_approval_tells_nothing_of_the_model_roots(
    governed: RunnerProcess,
) -> None:
    """Attack: an adapter load naming paths without a token: 400 "inside the model roots"
    for some, the gate's 401 for others, so the roots can be mapped. Before approval the
    path is text only: every path gets the gate's answer."""
    answers = []
    for path in ("/etc/hostname", "adapters/x.gguf"):
        body = {"adapterId": "m:x", "baseModel": "m", "path": path, "sha256": "0" * 64}
        body["tenants"] = ["acme"]
        answers.append(httpx.post(governed.url + "/v1/adapters/load", json=body))
    outside, inside = answers
    assert outside.status_code == inside.status_code == 401, outside.text
    assert outside.json()["error"] == inside.json()["error"]


def test_refused_governed_calls_are_audited_and_throttled_per_source(tmp_path: Path) -> None:
    """Attack: lifecycle and tenant-policy calls refused before approval left no audit
    record and cost nothing against the auth-failure throttle. Each is audited, and past
    the source's quota they (and wrong keys from that source) are 429; a right key is
    still served."""
    env = {"AUTH_FAILURE_SOURCE_LIMIT": "4/minute", "LIFECYCLE_RATE_LIMIT": "1000/minute"}
    with keyed_runner(tmp_path, env) as r:
        audit = tmp_path / "audit.jsonl"
        calls = [
            ("PUT", "/v1/tenants/evil", {"policy": {}}),
            ("DELETE", "/v1/tenants/acme", {}),
            ("POST", "/v1/models/load", {"modelId": "m"}),
            ("POST", "/v1/cache/flush", {"scope": "bogus"}),
        ]
        for method, path, body in calls:
            refused = httpx.request(method, r.url + path, json=body)
            assert refused.status_code in (400, 401), refused.text
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        assert [x["outcome"] for x in records] == ["rejected"] * 4
        operations = ["tenant-policy", "tenant-policy", "model-load", "cache-flush"]
        assert [x["operation"] for x in records] == operations
        throttled = httpx.post(r.url + "/v1/models/unload", json={"modelId": "m"})
        assert throttled.status_code == 429, throttled.text
        assert throttled.json()["error"]["code"] == "too_many_auth_failures"
        assert chat(r.url, {"Authorization": "Bearer " + "w" * 40}).status_code == 429
        assert chat(r.url, bearer("acme")).status_code == 200


def test_gateway_mode_without_peers_or_secret_refuses_to_start() -> None:
    """Attack: TENANT_IDENTITY=gateway with ADMIN_TENANTS and neither GATEWAY_PEERS nor
    GATEWAY_SECRET started, so anyone reaching the port was the admin by sending the
    fairness header. That configuration no longer starts (exit 2, naming the settings)."""
    code, log = start_refused({"TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": "ops"})
    assert code == 2, log
    assert "GATEWAY_PEERS" in log and "GATEWAY_SECRET" in log


def test_gateway_identity_comes_from_one_header_sent_once() -> None:
    """Attack: the gateway overwrites one fairness header; the client sends the other name
    (read when the newer is absent) or a second copy (the last one won). Only the llm-d
    name is read, and an identity header sent twice is 400."""
    env = {"TENANT_IDENTITY": "gateway", "ADMIN_TENANTS": "ops", "GATEWAY_PEERS": "127.0.0.1"}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded(r)
        older = httpx.get(
            r.url + "/ui/state.json", headers={"x-gateway-inference-fairness-id": "ops"}
        )
        assert older.status_code == 401, older.text
        twice = httpx.get(r.url + "/ui/state.json", headers=[(FAIRNESS, "acme"), (FAIRNESS, "ops")])
        assert twice.status_code == 400 and twice.json()["error"]["code"] == "invalid_header"
        assert httpx.get(r.url + "/ui/state.json", headers={FAIRNESS: "ops"}).status_code == 200


def test_wrong_keys_in_a_tenants_name_from_elsewhere_never_lock_it_out(tmp_path: Path) -> None:
    """Attack: twenty wrong keys naming `X-Tenant-ID: acme` from another address made
    acme's right key answer 429 for a minute. Failures count per (tenant, source) and the
    key is checked first: the guesser is throttled, acme is served from anywhere."""
    with keyed_runner(tmp_path, {"AUTH_FAILURE_SOURCE_LIMIT": "100/minute"}) as r, elsewhere() as c:
        url = r.url + "/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        named = {"X-Tenant-ID": "acme"}
        for n in range(20):
            wrong = c.post(url, json=body, headers={**named, "Authorization": f"Bearer g{n:040d}"})
            assert wrong.status_code == 401, wrong.text
        guess = c.post(url, json=body, headers={**named, "Authorization": "Bearer " + "g" * 41})
        assert guess.status_code == 429, guess.text  # the guesser is throttled
        right = c.post(url, json=body, headers={**named, **bearer("acme")})
        assert right.status_code == 200, right.text
        assert chat(r.url, {**named, **bearer("acme")}).status_code == 200


def test_wrong_admin_sign_ins_never_lock_the_admin_out(tmp_path: Path) -> None:
    """Attack: twenty wrong sign-ins as the admin locked the admin out of `/ui` for a
    minute. The right password is checked first and always signs in."""
    with keyed_runner(tmp_path) as r:
        for n in range(20):
            wrong = httpx.get(r.url + "/ui", headers=basic("ops", f"guess{n:035d}"))
            assert wrong.status_code == 401, wrong.text
        assert httpx.get(r.url + "/ui", headers=basic("ops", "y" * 40)).status_code == 429
        assert httpx.get(r.url + "/ui", headers=basic("ops", KEYS["ops"])).status_code == 200


def test_engines_get_none_of_the_runners_secrets() -> None:
    """Attack: engine code (a plugin, a custom node) reads its environment and finds
    WEBHOOK_SECRET, GATEWAY_SECRET, Redis credentials and the cache-salt secret. Engines
    start with an allow-listed environment: none of them, nor anything unlisted."""
    secrets = {
        "WEBHOOK_SECRET": SHARED_SECRET,
        "GATEWAY_SECRET": "gateway-secret-0123456789abcdef",
        "VLLM_CACHE_SALT_SECRET": "salt-secret-0123456789abcdef",
        "REDIS_PASSWORD": "redis-password-0123456789",
        "QUORUM_UNLISTED_SETTING": "unlisted-0123456789",
    }
    env = {"TENANT_IDENTITY": "gateway", **secrets}
    with start_runner(models_file=stand_in_models(), env=env) as r:
        wait_loaded_as(r, {FAIRNESS: "acme", "X-Quorum-Gateway-Secret": secrets["GATEWAY_SECRET"]})
        (pid,) = engine_pids(r.proc.pid, b"fake_llama_cli")
        engine_env = process_env(pid)
        leaked = [name for name, value in secrets.items() if value in engine_env.values()]
        assert leaked == [], leaked
        assert "PATH" in engine_env


def wait_loaded_as(r: RunnerProcess, headers: dict[str, str]) -> None:
    """Until the runner's preloaded model answers (its engine runs)."""
    wait_loaded(r)
    answer = chat(r.url, headers)
    assert answer.status_code == 200, answer.text


def test_one_address_holding_sockets_does_not_starve_the_others() -> None:
    """Attack: one unauthenticated address opens every connection MAX_CONNECTIONS allows
    and holds them, so every other client gets 503 too_many_connections. Connections are
    capped per source address: past its share it gets 429, and the others are served."""
    env = {"MAX_CONNECTIONS": "6", "MAX_CONNECTIONS_PER_SOURCE": "4"}
    with start_runner(models_file=stand_in_models(), env=env) as r, contextlib.ExitStack() as held:
        statuses = []
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", r.port), 10, (ELSEWHERE, 0))
            sock.settimeout(10)
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            statuses.append(sock.recv(65536).split(b" ", 2)[1])
            if statuses[-1] == b"200":
                held.enter_context(sock)  # held open; a refused one is let go
            else:
                sock.close()
        eventually(lambda: _status(r.url + "/health/live") == 200, timeout=10)
        assert statuses == [b"200"] * 4 + [b"429"] * 2, statuses


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return 0


def test_half_sent_scrapes_hold_a_bounded_number_of_threads() -> None:
    """Attack: the metrics port started a thread per connection with no timeout: a
    thousand half-sent requests were a thousand threads, for ever. It serves at most a
    few at once (the rest are closed unread) and each gives up when silent."""
    port = free_port()
    env = {"METRICS_PORT": str(port), "METRICS_ON_API_PORT": "false"}
    with start_runner(models_file=stand_in_models(), env=env) as r, contextlib.ExitStack() as held:
        wait_loaded(r)
        before = len(os.listdir(f"/proc/{r.proc.pid}/task"))
        socks = []
        for _ in range(40):
            sock = held.enter_context(socket.create_connection(("127.0.0.1", port), 10))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            socks.append(sock)
        assert len(_closed_by_peer(socks, bound_s=10)) >= 30
        assert len(os.listdir(f"/proc/{r.proc.pid}/task")) <= before + 8


def _closed_by_peer(socks: list[socket.socket], bound_s: float) -> set[socket.socket]:
    """The sockets the runner closed (EOF or reset), waiting at most `bound_s` for 30."""
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + bound_s
    while len(closed) < 30 and time.monotonic() < deadline:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.2)
        for sock in readable:
            try:
                if sock.recv(1) == b"":
                    closed.add(sock)
            except ConnectionResetError:
                closed.add(sock)
    return closed


def test_priority_ceiling_is_normal_unless_granted(tmp_path: Path) -> None:
    """Attack: a tenant sends every request `X-Priority: high` and is served ahead of the
    others (the default ceiling was `high`). Without a grant in the tenants file the
    ceiling is `normal`; a granted tenant keeps `high`."""
    with keyed_runner(tmp_path, tenants={"ops": {"priority": {"max": "high"}}}) as r:
        asked = {"X-Priority": "high"}
        plain = chat(r.url, {**bearer("acme"), **asked})
        assert plain.headers["x-effective-priority"] == "normal", plain.headers
        granted = chat(r.url, {**bearer("ops"), **asked})
        assert granted.headers["x-effective-priority"] == "high"


def test_adapters_are_shown_only_to_their_tenants(tmp_path: Path) -> None:
    """Attack: capabilities listed tenant-bound adapters (their sha256, live counts) to
    anonymous callers, and a chat naming one answered 403 where a missing one is 404. An
    adapter is listed to its tenants (and admins) only; to anyone else naming it is the
    same as naming an id no adapter has."""
    adapter = tmp_path / "own.gguf"
    adapter.write_bytes(b"GGUF adapter stand-in")
    models = "models:\n" + entry("m", "llama-server-ok")  # not started: the stand-in
    # takes no --lora
    models += f"    adapters:\n      - {{name: own, path: {adapter}, tenants: [acme]}}\n"
    with keyed_runner(tmp_path, models=models) as r:
        anonymous = httpx.get(r.url + "/v1/capabilities").json()
        assert "m:own" not in json.dumps(anonymous.get("adapters", []))
        mine = httpx.get(r.url + "/v1/capabilities", headers=bearer("acme")).json()
        assert [a["id"] for a in mine["adapters"]] == ["m:own"]
        admin = httpx.get(r.url + "/v1/capabilities", headers=bearer("ops")).json()
        assert [a["id"] for a in admin["adapters"]] == ["m:own"]
        bound = chat(r.url, bearer("globex"), model="m:own")
        missing = chat(r.url, bearer("globex"), model="m:none")
        assert bound.status_code == missing.status_code == 404, bound.text
        assert (
            bound.json()["error"]["message"].replace("m:own", "m:none")
            == (missing.json()["error"]["message"])
        )
