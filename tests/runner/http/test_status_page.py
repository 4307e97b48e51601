"""The status page end to end: a real runner, Debian's Chromium over the DevTools protocol.

It renders for an admin, follows a governed load from `absent` through `loading` to
`ready`, shows a tenant's queued requests (counts, never prompts), the governance decision
that approved the load (who signed) and an engine restart, and each tenant's budgets and
in-flight cap; screenshots are kept as artefacts. Anyone else gets 401 (no identity) or
403 (not an admin).
"""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from runner.memory.proc import child_pids
from tests.fixtures.launch import start_fake
from tests.support.artefacts import artefact
from tests.support.chromium import Page, open_browser
from tests.support.fleet import Model, full_queue, load_token, runner
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import ADMIN_KEY, DEV_AUDIT_KEY, FAIRNESS, admin_env, gateway_env

pytestmark = pytest.mark.timeout(180)

RID = "page-runner"
PROMPT = "PROMPT-TEXT-7f3a"  # must never reach the page
ACME_KEY = "acme-page-key-0123456789abcdef012345678"
MODELS = {
    "ok": Model("llama-server-ok", preload=True, restart=True),
    "slower": Model("llama-server-slower"),
    "held": Model("llama-server-paced-long", preload=True),
}


def basic(user: str, password: str = "") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def r(tmp_path: Path) -> Iterator[RunnerProcess]:
    """A runner whose admin is `ops`, its audit log in a file; `ok` restarts when it dies."""
    env = {
        **admin_env(tmp_path, acme=ACME_KEY),
        "GOVERNANCE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        "GOVERNANCE_AUDIT_KEY": str(DEV_AUDIT_KEY),
    }
    with runner(RID, models=MODELS, env=env) as proc:
        yield proc


def row_state(page: Page, model: str) -> str | None:
    value = page.evaluate(
        f"document.querySelector('#models tr[data-model=\"{model}\"]')?.dataset.state"
    )
    return value if isinstance(value, str) else None


def restart(r: RunnerProcess, model: str) -> None:
    """Kill `model`'s engine (a child of the runner started with `--alias model`)."""
    for pid in child_pids(r.proc.pid) or []:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--alias" in argv and argv[argv.index(b"--alias") + 1] == model.encode():
            os.kill(pid, signal.SIGKILL)
            return
    raise AssertionError(f"no engine for {model}")


def test_status_page_refuses_everyone_but_admins(r: RunnerProcess) -> None:
    """No identity: 401 with a Basic challenge; a tenant that is not an admin: 403 on every
    /ui path; an admin reads the page; unknown files under /ui are 404."""
    plain = httpx.get(r.url + "/ui")
    assert plain.status_code == 401 and plain.headers["www-authenticate"].startswith("Basic ")
    for path in ("/ui", "/ui/state.json", "/ui/app.js"):
        for headers in ({"Authorization": f"Bearer {ACME_KEY}"}, basic("acme", ACME_KEY)):
            answer = httpx.get(r.url + path, headers=headers)
            assert answer.status_code == 403, (path, headers)
            assert answer.json()["error"]["code"] == "forbidden"
    page = httpx.get(r.url + "/ui", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(r.url + "/ui/secret.txt", headers=basic("ops", ADMIN_KEY)).status_code == 404


def test_status_page_in_chromium_follows_a_governed_load(r: RunnerProcess) -> None:
    """The page renders in Chromium, shows `slower` go from absent through loading (with
    its progress) to ready after a governed load, the decision that approved it, queued
    requests per tenant and priority, and an engine restart; a screenshot is kept."""
    queued_as = {"Authorization": f"Bearer {ACME_KEY}", "X-Priority": "low"}
    with (
        open_browser(headers=basic("ops", ADMIN_KEY)) as page,
        full_queue(r, 2, model="held", headers=queued_as, prompt=PROMPT, holder=queued_as),
    ):
        page.navigate(r.url + "/ui")
        page.wait_for("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.getElementById('runner-id').textContent") == RID
        assert row_state(page, "ok") == "ready" and row_state(page, "slower") == "absent"

        token = load_token(RID, "slower")
        accepted = httpx.post(
            r.url + "/v1/models/load", json={"modelId": "slower", "verifiedOpToken": token}
        )
        assert accepted.status_code == 202
        eventually(lambda: row_state(page, "slower") == "loading")
        page.wait_for("!!document.querySelector('#loads tr[data-model=\"slower\"] progress')")
        page.wait_for(
            "[...document.querySelectorAll('#audit tbody tr')].some(tr => "
            "tr.dataset.operation === 'model-load' && tr.dataset.outcome === 'approved' && "
            "tr.textContent.includes('admin1, admin2'))"
        )
        queue = page.wait_for(
            "document.querySelector('#queues tr[data-tenant=\"acme\"]')?.textContent"
        )
        assert queue == "acme002"  # high 0, normal 0, low 2
        restart(r, "ok")
        page.wait_for(
            "document.querySelector('#models tr[data-model=\"ok\"]').children[5].textContent"
            " === '1'",
            timeout=30,
        )
        eventually(lambda: row_state(page, "slower") == "ready", timeout=30)
        eventually(lambda: row_state(page, "ok") == "ready", timeout=30)
        shot = page.screenshot(artefact("status-page.png"))
        html = page.evaluate("document.documentElement.outerHTML")
        state = httpx.get(r.url + "/ui/state.json", headers=basic("ops", ADMIN_KEY)).text
    assert shot.stat().st_size > 10_000 and shot.read_bytes().startswith(b"\x89PNG")
    for text in (html, state):
        assert PROMPT not in text
        assert token["signatures"][0]["signature"] not in text
        assert json.loads(base64.urlsafe_b64decode(token["payload"] + "=="))["nonce"] not in text
    assert page.console == []


def test_status_page_in_chromium_for_a_non_admin_is_403(r: RunnerProcess) -> None:
    """Signed in as a tenant that is not an admin, the browser gets the 403 envelope only."""
    with open_browser(headers=basic("acme", ACME_KEY)) as page:
        page.navigate(r.url + "/ui")
        text = page.evaluate("document.body.innerText")
    assert json.loads(text)["error"]["code"] == "forbidden"


TENANTS = """
tenants:
  ops: {}
  acme:
    models: [echo]
    priority: {default: low, max: normal}
    max_in_flight: 1
    token_budgets:
      - {tokens: 5000, per: hour}
      - {tokens: 900, per: minute, count: output}
"""


def test_status_page_in_chromium_shows_each_tenants_budgets_and_cap(tmp_path: Path) -> None:
    """The tenants' view: each declared tenant's priority, models, in flight against its
    cap, queued requests, and each token budget with what its window has used and what is
    left (the same figures as state.json, which are the budget's counters); a screenshot
    is kept."""
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    env = {"TENANTS_FILE": str(path), **gateway_env()}  # behind a gateway: it names tenants
    acme = {FAIRNESS: "acme"}
    url_of = "/v1/chat/completions"
    with (
        start_fake("fake_openai", "--chunks", "400", "--chunk-delay-ms", "100") as echo,
        start_runner({"echo": echo.url}, env=env) as r,
        ThreadPoolExecutor(1) as pool,
        open_browser(headers={FAIRNESS: "ops"}) as page,
    ):
        whole = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = httpx.post(r.url + url_of, json=whole, headers=acme, timeout=30)
        assert answer.status_code == 200
        held = {**whole, "stream": True, "max_tokens": 300}
        with httpx.stream("POST", r.url + url_of, json=held, headers=acme, timeout=60) as stream:
            chunks = stream.iter_raw()  # keep a reference: dropping it would hang up at once
            next(chunks)  # in flight: acme is at its cap of 1
            queued = pool.submit(httpx.post, r.url + url_of, json=whole, headers=acme, timeout=60)
            page.navigate(r.url + "/ui")
            cell = "document.querySelector('#tenants tr[data-tenant=\"acme\"]')"
            page.wait_for(f"{cell}?.querySelector('.queued')?.textContent === '1'")
            assert page.evaluate(f"{cell}.querySelector('.in-flight').textContent") == "1 / 1"
            text = page.evaluate(f"{cell}.textContent")
            state = httpx.get(r.url + "/ui/state.json", headers={FAIRNESS: "ops"}).json()
            shot = page.screenshot(artefact("status-page-tenants.png"))
        assert queued.result(60).status_code == 200
    (row,) = [t for t in state["tenants"] if t["tenant"] == "acme"]
    assert row["priority"] == {"default": "low", "max": "normal"} and row["models"] == ["echo"]
    assert (row["inFlight"], row["maxInFlight"], row["queued"]) == (1, 1, 1)
    hour, minute = row["budgets"]
    usage = answer.json()["usage"]
    # the whole answer's usage, then the stream's and the queued request's reservations
    assert hour["used"] > usage["total_tokens"] + 300 + 4
    assert minute["used"] == usage["completion_tokens"] + 300 + 4
    for b in (hour, minute):
        assert b["remaining"] == b["tokens"] - b["used"]
        assert f"{b['remaining']} left of {b['budget']}" in text
    assert "acme" in text and "low (max normal)" in text
    assert [t["tenant"] for t in state["tenants"]] == ["acme", "ops"]
    assert shot.stat().st_size > 10_000
    assert page.console == []
