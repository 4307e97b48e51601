"""The operator verbs of `quorum`, run as a user runs them: through a pseudo-terminal
(pexpect: live progress bar, tables) and with --json, against real runner processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.support.fleet import Model, caps, runner
from tests.support.poll import eventually
from tests.support.runner_proc import REPO_ROOT, RunnerProcess
from tests.support.tokens import ADMIN_KEY, admin_env, dev_token

pytestmark = pytest.mark.timeout(120)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
QUORUM = str(Path(sys.executable).parent / "quorum")
RID = "cli-runner"
MODELS = {
    "ok": Model("llama-server-ok", preload=True),
    "slow": Model("llama-server-slow"),
    "broken": Model("llama-server-exits-at-start"),
}


ACME_KEY = "acme-cli-key-0123456789abcdef0123456789"


@pytest.fixture
def r(tmp_path: Path) -> Iterator[RunnerProcess]:
    """A runner with `ok` loaded, `slow` (3 s to load) and `broken` (exits at start); its
    admin `ops` and tenant `acme` sign in with their keys."""
    with runner(RID, models=MODELS, env=admin_env(tmp_path, acme=ACME_KEY)) as proc:
        yield proc


def token_file(tmp_path: Path, operation: str, model: str | None, **params: object) -> str:
    path = tmp_path / f"{operation}-{model}.json"
    path.write_text(json.dumps(dev_token(operation, model, params, aud=RID)))
    return str(path)


def pty(*args: str) -> pexpect.spawn:
    """`quorum ARGS` on a pseudo-terminal 120 columns wide."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    env.pop("NO_COLOR", None)
    return pexpect.spawn(
        QUORUM,
        list(args),
        env=env,
        cwd=str(REPO_ROOT),
        dimensions=(40, 120),
        timeout=60,
        encoding="utf-8",
        codec_errors="replace",
    )


def plain(child: pexpect.spawn) -> str:
    """Everything the child wrote until it exited, terminal escapes and runs of white space
    (the cursor moves and line ends that redrew its frames) made one space."""
    text = child.read()
    child.close()
    return " ".join(ANSI.sub(" ", text).split())


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [QUORUM, *args, "--json"], capture_output=True, text=True, timeout=90, cwd=REPO_ROOT
    )
    return done.returncode, json.loads(done.stdout)


def test_load_shows_progress_on_a_terminal_and_exits_0(r: RunnerProcess, tmp_path: Path) -> None:
    """`quorum load` draws a live bar with status and eta until the task completes, exit 0."""
    child = pty(
        "load",
        "slow",
        "--token",
        token_file(tmp_path, "model-load", "slow"),
        "--url",
        r.url,
        "--interval",
        "0.2",
    )
    screen = plain(child)
    assert child.exitstatus == 0
    assert re.search(r"task load-[0-9a-f]{32} on http://127\.0\.0\.1", screen)
    frames = re.findall(r"slow [━╺╸ ]+ (\d+)% (\w+) eta (-|\d+ s)", screen)
    loading = [(int(p), eta) for p, status, eta in frames if status == "loading"]
    assert len(loading) >= 2 and all(eta.endswith(" s") for _, eta in loading)  # redrawn
    assert [p for p, _ in loading] == sorted(p for p, _ in loading)
    assert frames[-1] == ("100", "completed", "0 s")
    assert re.search(r"completed: slow loaded on http://127\.0\.0\.1:\d+ in \d+\.\d s", screen)
    assert "slow" in [m["id"] for m in caps(r)["models"]["loaded"]]


def test_load_failure_exits_1_with_the_task_error(r: RunnerProcess, tmp_path: Path) -> None:
    """A load whose engine exits at start: the bar ends, the task's error is printed, exit 1."""
    child = pty(
        "load",
        "broken",
        "--token",
        token_file(tmp_path, "model-load", "broken"),
        "--url",
        r.url,
        "--interval",
        "0.2",
    )
    child.expect(r"quorum load: .*load of 'broken' \(load-[0-9a-f]+\) failed: .*exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1


def test_load_json_outcomes(r: RunnerProcess, tmp_path: Path) -> None:
    """--json prints one document: completed with figures (exit 0) or failed with the
    error (exit 1); a token for another model is refused before anything is sent (exit 2)."""
    code, doc = run_json(
        "load",
        "slow",
        "--token",
        token_file(tmp_path, "model-load", "slow"),
        "--url",
        r.url,
        "--interval",
        "0.2",
    )
    assert code == 0, doc
    assert doc["ok"] and doc["status"] == "completed" and doc["modelId"] == "slow"
    assert doc["taskId"].startswith("load-") and doc["loadTimeMs"] > 0
    code, doc = run_json(
        "load", "broken", "--token", token_file(tmp_path, "model-load", "broken"), "--url", r.url
    )
    assert code == 1 and doc["ok"] is False and doc["status"] == "failed"
    assert "exit" in doc["error"]
    code, doc = run_json(
        "load", "slow", "--token", token_file(tmp_path, "model-load", "ok"), "--url", r.url
    )
    assert code == 2 and "approves model-load of 'ok', not 'slow'" in doc["error"]


def test_status_table_on_a_terminal_and_json(r: RunnerProcess) -> None:
    """`quorum status URL URL` shows each runner's models, memory, queue and health; a
    runner that does not answer is shown as unreachable and makes the exit status 1."""
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    child = pty("status", r.url, dead)
    screen = plain(child)
    assert child.exitstatus == 1
    assert re.search(rf"│ {RID} │ healthy │ \d+/\d+ MB", screen)  # cells may wrap below
    assert re.search(r"│ 0% of \d+ MB │ 0/16 │ 0/0/0 │ 0 ms │", screen)
    assert "│ http://127.0.0.1:9 │ unreachable │" in screen and "refused" in screen
    assert re.search(rf"│ {RID} │ ok │ loaded │ \d+ MB │", screen)
    assert f"│ {RID} │ slow │ available │" in screen
    code, doc = run_json("status", "--url", r.url)
    assert code == 0
    (one,) = doc["runners"]
    assert one["healthy"] and one["capabilities"]["runnerId"] == RID
    assert one["queueByPriority"] == {"high": 0, "normal": 0, "low": 0}
    code, doc = run_json("status", r.url, dead)
    assert code == 1 and [x["reachable"] for x in doc["runners"]] == [True, False]


def test_unload_flush_cancel_and_tasks(r: RunnerProcess, tmp_path: Path) -> None:
    """The governed verbs send what their token approves; flags that disagree with the
    token are refused with exit 2; tasks are shown by id or, without, those running."""
    code, doc = run_json(
        "flush",
        "--scope",
        "all",
        "--token",
        token_file(tmp_path, "cache-flush", None, scope="all"),
        "--url",
        r.url,
    )
    assert code == 0 and doc["ok"] and doc["flushed"] is True
    code, doc = run_json(
        "flush",
        "--scope",
        "tenant",
        "--tenant-id",
        "acme",
        "--token",
        token_file(tmp_path, "cache-flush", None, scope="all"),
        "--url",
        r.url,
    )
    assert code == 2 and "approves scope='all', not 'tenant'" in doc["error"]
    code, doc = run_json(
        "unload", "ok", "--token", token_file(tmp_path, "model-unload", "ok"), "--url", r.url
    )
    assert code == 0 and doc["modelId"] == "ok" and doc["kvCacheFlushed"] is True

    slow = subprocess.Popen(
        [
            QUORUM,
            "load",
            "slow",
            "--token",
            token_file(tmp_path, "model-load", "slow"),
            "--url",
            r.url,
            "--json",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    eventually(lambda: bool(caps(r)["models"]["loading"]))
    code, doc = run_json("tasks", "--url", r.url)
    assert code == 0 and [t["modelId"] for t in doc["tasks"]] == ["slow"]
    assert doc["tasks"][0]["status"] == "loading"
    out, _ = slow.communicate(timeout=60)
    task = json.loads(out)["taskId"]
    code, doc = run_json("tasks", task, "--url", r.url)
    assert code == 0 and doc["tasks"][0]["status"] == "completed"
    cancel = token_file(tmp_path, "task-cancel", "slow", taskId=task)
    code, doc = run_json("cancel", task, "--token", cancel, "--url", r.url)
    assert code == 1 and doc["httpStatus"] == 409  # a finished task cannot be cancelled


def test_logs_for_admins_only(r: RunnerProcess) -> None:
    """`quorum logs` prints an engine's lines to an admin tenant; anyone else gets exit 1."""
    child = pty("logs", "ok", "--url", r.url, "--api-key", ADMIN_KEY)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    code, doc = run_json("logs", "ok", "--url", r.url, "--api-key", ADMIN_KEY)
    assert code == 0 and doc["modelId"] == "ok" and isinstance(doc["lines"], list)
    code, doc = run_json("logs", "ok", "--url", r.url, "--api-key", ACME_KEY)
    assert code == 1 and doc["httpStatus"] == 403
