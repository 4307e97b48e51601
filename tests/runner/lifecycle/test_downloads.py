"""Downloads from a Hugging Face Hub report their progress: the meter through the real
huggingface_hub against a paced stand-in hub, and a governed load of a repo that is not on
disk through the runner (status downloading, progress rising, then completed)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.lifecycle.downloads import ByteMeter, fetch_snapshot
from tests.fixtures.launch import start_fake
from tests.support.runner_proc import fixture_bin, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(90)

REPO = "someorg/paced-model-GGUF"


@contextlib.contextmanager
def fake_hub(size_mb: float = 40, rate_mb_s: float = 10) -> Iterator[str]:
    with start_fake("fake_hf_hub", "--size-mb", str(size_mb), "--rate-mb-s", str(rate_mb_s)) as hub:
        yield hub.url


def test_meter_follows_the_bytes_of_a_real_huggingface_hub_download(tmp_path: Path) -> None:
    """huggingface_hub feeds the meter's byte bar per 10 MB chunk: the fraction rises
    while the file arrives, ends at 1, and the expected size is the file's."""
    with fake_hub() as url:
        meter = ByteMeter()
        result: dict[str, str] = {}
        worker = threading.Thread(
            target=lambda: result.update(
                path=fetch_snapshot(REPO, tmp_path / "hub", ["*.gguf"], meter, endpoint=url)
            )
        )
        worker.start()
        seen = []
        while worker.is_alive():
            seen.append(meter.fraction())
            time.sleep(0.1)
        worker.join()
    assert (Path(result["path"]) / "model-q4_k_m.gguf").stat().st_size == 40 * 2**20
    during = [f for f in seen if f is not None and 0 < f < 1]
    assert during, f"no fraction between 0 and 1 was seen: {seen}"
    assert during == sorted(during)
    assert meter.fraction() == 1.0
    assert meter.expected_mb() == 40


def _poll(url: str, task_id: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc: dict[str, Any] = httpx.get(f"{url}/v1/models/load/{task_id}").json()
        docs.append(doc)
        if doc["status"] in ("completed", "failed", "cancelled"):
            return docs
        time.sleep(0.2)
    raise AssertionError(f"task {task_id} did not finish: {docs[-1]}")


def _hub_runner_env(hub: str, tmp_path: Path) -> dict[str, str]:
    return {
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_ENDPOINT": hub,
        "LLAMA_SERVER_BIN": fixture_bin("llama-server-ok"),
    }


def _load(url: str) -> str:
    token = dev_token("model-load", REPO, {})
    accepted = httpx.post(url + "/v1/models/load", json={"modelId": REPO, "verifiedOpToken": token})
    assert accepted.status_code == 202, accepted.text
    task_id: str = accepted.json()["taskId"]
    return task_id


def test_load_cancelled_while_downloading_ends_at_once_and_a_later_load_completes(
    tmp_path: Path,
) -> None:
    """DELETE on a downloading task: cancelled at once (the download thread finishes the
    file in the background); the runner keeps answering, and a new load completes."""
    with (
        fake_hub(size_mb=40, rate_mb_s=10) as hub,
        start_runner(models_file="models: []\n", env=_hub_runner_env(hub, tmp_path)) as r,
    ):
        task = _load(r.url)
        deadline = time.monotonic() + 10
        while httpx.get(f"{r.url}/v1/models/load/{task}").json()["status"] != "downloading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        token = dev_token("task-cancel", REPO, {"taskId": task})
        cancel = httpx.request(
            "DELETE",
            f"{r.url}/v1/models/load/{task}",
            headers={"X-Op-Token": json.dumps(token)},
        )
        assert cancel.status_code == 200, cancel.text
        assert httpx.get(f"{r.url}/v1/models/load/{task}").json()["status"] == "cancelled"
        assert httpx.get(f"{r.url}/health").status_code == 200
        docs = _poll(r.url, _load(r.url))
    assert docs[-1]["status"] == "completed", docs[-1]["error"]


def test_load_of_a_repo_not_on_disk_reports_download_progress(tmp_path: Path) -> None:
    """A governed load of a Hub repo: the task reads downloading with progress rising above
    0 and an eta, never going back, then completed; the file is in HF_HOME."""
    with (
        fake_hub() as hub,
        start_runner(models_file="models: []\n", env=_hub_runner_env(hub, tmp_path)) as r,
    ):
        docs = _poll(r.url, _load(r.url))
    assert docs[-1]["status"] == "completed", docs[-1]
    downloading = [d for d in docs if d["status"] == "downloading"]
    assert any(0 < d["progress"] < 1 and d["eta"] > 0 for d in downloading), downloading
    progress = [d["progress"] for d in docs]
    assert progress == sorted(progress)  # a monotone bar, across download and load
    blobs = list((tmp_path / "hf" / "hub").glob("models--someorg--paced-model-GGUF/blobs/*"))
    assert [b.stat().st_size for b in blobs] == [40 * 2**20]
