"""The status page end to end: a real runner, Debian's Chromium over the DevTools protocol.

It renders for an admin, follows a governed load from `absent` through `loading` to
`ready`, shows a tenant's queued requests (counts, never prompts), the governance decision
that approved the load (who signed) and an engine restart; a screenshot is kept as an
artefact. Anyone else gets 401 (no identity) or 403 (not an admin).
"""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner.memory.proc import child_pids
from tests.support.artefacts import artefact
from tests.support.chromium import Page, open_browser
from tests.support.fleet import Model, full_queue, load_token, runner, wait_for
from tests.support.runner_proc import RunnerProcess

pytestmark = pytest.mark.timeout(180)

RID = "page-runner"
PROMPT = "PROMPT-TEXT-7f3a"  # must never reach the page
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
    env = {"ADMIN_TENANTS": "ops", "GOVERNANCE_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
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
        for headers in ({"X-Tenant-ID": "acme"}, basic("acme")):
            answer = httpx.get(r.url + path, headers=headers)
            assert answer.status_code == 403, (path, headers)
            assert answer.json()["error"]["code"] == "forbidden"
    page = httpx.get(r.url + "/ui", headers={"X-Tenant-ID": "ops"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(r.url + "/ui/secret.txt", headers=basic("ops")).status_code == 404


def test_status_page_in_chromium_follows_a_governed_load(r: RunnerProcess) -> None:
    """The page renders in Chromium, shows `slower` go from absent through loading (with
    its progress) to ready after a governed load, the decision that approved it, queued
    requests per tenant and priority, and an engine restart; a screenshot is kept."""
    queued_as = {"X-Tenant-ID": "acme", "X-Priority": "low"}
    with (
        open_browser(headers=basic("ops")) as page,
        full_queue(r, 2, model="held", headers=queued_as, prompt=PROMPT),
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
        wait_for(lambda: row_state(page, "slower") == "loading")
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
        wait_for(lambda: row_state(page, "slower") == "ready", timeout=30)
        wait_for(lambda: row_state(page, "ok") == "ready", timeout=30)
        shot = page.screenshot(artefact("status-page.png"))
        html = page.evaluate("document.documentElement.outerHTML")
        state = httpx.get(r.url + "/ui/state.json", headers=basic("ops")).text
    assert shot.stat().st_size > 10_000 and shot.read_bytes().startswith(b"\x89PNG")
    for text in (html, state):
        assert PROMPT not in text
        assert token["signatures"][0]["signature"] not in text
        assert json.loads(base64.urlsafe_b64decode(token["payload"] + "=="))["nonce"] not in text
    assert page.console == []


def test_status_page_in_chromium_for_a_non_admin_is_403(r: RunnerProcess) -> None:
    """Signed in as a tenant that is not an admin, the browser gets the 403 envelope only."""
    with open_browser(headers=basic("acme")) as page:
        page.navigate(r.url + "/ui")
        text = page.evaluate("document.body.innerText")
    assert json.loads(text)["error"]["code"] == "forbidden"
