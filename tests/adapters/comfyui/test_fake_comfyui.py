"""The fake ComfyUI keeps to ComfyUI's real API (server.py, execution.py, main.py), so the
adapter tests against it mean something: event order, routes, refusals, cache, /free."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.adapters.comfyui.support import CHECKPOINT, comfy_base, model_free, txt2img
from tests.fixtures._comfy_worker import blur_ms
from tests.fixtures.fake_comfyui import parser
from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.poll import eventually_async


async def _events_of_one_prompt(comfy: FakeEngine, http: httpx.AsyncClient) -> list[dict[str, Any]]:
    sid = uuid.uuid4().hex
    events: list[dict[str, Any]] = []
    ws_url = comfy.url.replace("http://", "ws://") + f"/ws?clientId={sid}"
    async with connect(ws_url, proxy=None) as ws:
        events.append(orjson.loads(await ws.recv()))
        prompt_id = str(uuid.uuid4())
        body = {
            "prompt": txt2img("a cat", "quorum/order", steps=2),
            "client_id": sid,
            "prompt_id": prompt_id,
        }
        assert (await http.post("/prompt", json=body)).status_code == 200
        while True:
            event = orjson.loads(await ws.recv())
            events.append(event)
            if event["type"] == "executing" and event["data"]["node"] is None:
                return events


async def test_fake_sends_events_in_comfyuis_order(
    comfy: FakeEngine, http: httpx.AsyncClient
) -> None:
    """status on connect (with sid), then start, cached, per node executing (+ progress,
    executed), success, and the end marker after the queue status."""
    events = await _events_of_one_prompt(comfy, http)
    assert events[0]["type"] == "status" and "sid" in events[0]["data"]
    kinds = [e["type"] for e in events[1:] if e["type"] not in ("status", "progress_state")]
    nodes = [e["data"]["node"] for e in events if e["type"] == "executing"]
    assert kinds[:2] == ["execution_start", "execution_cached"]
    assert kinds[-2:] == ["execution_success", "executing"]
    cached = next(e for e in events if e["type"] == "execution_cached")["data"]["nodes"]
    assert nodes[-1] is None
    assert sorted(nodes[:-1] + cached) == ["3", "4", "5", "6", "7", "8", "9"]
    ran = [n for n in nodes[:-1]]
    assert ran[-3:] == ["3", "8", "9"]  # sampler after its inputs, then decode, then save
    assert kinds.count("progress") == 2
    executed = [e for e in events if e["type"] == "executed"]
    assert executed[-1]["data"]["node"] == "9"
    assert executed[-1]["data"]["output"]["images"][0]["type"] == "output"
    assert [e["type"] for e in events][-2] == "status"  # the history is written first
    stamps = [e["data"]["timestamp"] for e in events if e["type"].startswith("execution_")]
    assert stamps == sorted(stamps)


async def test_fake_serves_every_route_under_api_too(http: httpx.AsyncClient) -> None:
    """ComfyUI adds every route again under /api/."""
    for path in (
        "/queue",
        "/system_stats",
        "/object_info/SaveImage",
        "/models/checkpoints",
        "/prompt",
    ):
        plain, api = await http.get(path), await http.get("/api" + path)
        assert plain.status_code == api.status_code == 200
        assert plain.json() == api.json()
    answer = await http.post("/api/prompt", json={"prompt": model_free("quorum/api")})
    assert answer.status_code == 200 and answer.json()["node_errors"] == {}


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({}, 400, "no_prompt"),
        ({"prompt": {"1": {"class_type": "EmptyImage", "inputs": {}}}}, 400, "prompt_no_outputs"),
        ({"prompt": {"1": {"inputs": {}}}}, 400, "missing_node_type"),
        ({"prompt": {"1": {"class_type": "Nope", "inputs": {}}}}, 400, "missing_node_type"),
        ({"prompt": {}, "prompt_id": "not-a-uuid"}, 400, "invalid_prompt_id"),
        ({"prompt": {}, "prompt_id": str(uuid.uuid4()).upper()}, 400, "invalid_prompt_id"),
    ],
)
async def test_fake_refuses_as_comfyui_does(
    http: httpx.AsyncClient, body: dict[str, Any], status: int, kind: str
) -> None:
    """The refusals of POST /prompt carry ComfyUI's error types and an empty node_errors."""
    response = await http.post("/prompt", json=body)
    assert response.status_code == status
    doc = response.json()
    assert doc["error"]["type"] == kind
    assert set(doc["error"]) == {"type", "message", "details", "extra_info"}
    assert doc["node_errors"] == {}


async def test_fake_answers_409_to_a_duplicate_prompt_id(http: httpx.AsyncClient) -> None:
    """v0.38+: a prompt id already queued or in history is a 409 `duplicate_prompt_id`."""
    prompt_id = str(uuid.uuid4())
    first = await http.post(
        "/prompt", json={"prompt": model_free("quorum/a"), "prompt_id": prompt_id}
    )
    again = await http.post(
        "/prompt", json={"prompt": model_free("quorum/b"), "prompt_id": prompt_id}
    )
    assert first.status_code == 200 and first.json()["prompt_id"] == prompt_id
    assert again.status_code == 409 and again.json()["error"]["type"] == "duplicate_prompt_id"


async def test_fake_node_errors_name_the_input(http: httpx.AsyncClient) -> None:
    """A failing input: `node_errors[id]` with errors, dependent_outputs and class_type; a
    list of more than 20 choices (ComfyUI's 42 samplers) is given by its length only."""
    graph = txt2img("x", "quorum/ne")
    graph["3"]["inputs"]["sampler_name"] = "nope"
    doc = (await http.post("/prompt", json={"prompt": graph})).json()
    assert doc["error"]["type"] == "prompt_outputs_failed_validation"
    entry = doc["node_errors"]["3"]
    assert entry["class_type"] == "KSampler" and entry["dependent_outputs"] == ["9"]
    assert entry["errors"][0]["type"] == "value_not_in_list"
    assert entry["errors"][0]["details"] == "sampler_name: 'nope' not in (list of length 42)"


async def test_fake_serves_an_identical_graph_from_its_cache(
    comfy: FakeEngine, http: httpx.AsyncClient
) -> None:
    """Resubmitted unchanged, a graph is not run again: `executed` names the earlier file
    (why every job needs its own filename_prefix)."""
    graph = model_free("quorum/same")
    names = []
    for _ in range(2):
        answer = await http.post("/prompt", json={"prompt": graph})
        prompt_id = answer.json()["prompt_id"]

        async def done(pid: str = prompt_id) -> bool:
            return bool((await http.get(f"/history/{pid}")).json())

        await eventually_async(done)
        entry = (await http.get(f"/history/{prompt_id}")).json()[prompt_id]
        names.append(entry["outputs"]["3"]["images"][0]["filename"])
    second_cached = next(m for m in entry["status"]["messages"] if m[0] == "execution_cached")
    assert names[0] == names[1]
    assert set(second_cached[1]["nodes"]) == {"1", "2", "3"}


async def test_fake_view_refuses_paths_outside_output(http: httpx.AsyncClient) -> None:
    """/view: '..' or a leading '/' is 400, a subfolder outside output 403, missing 404."""
    assert (await http.get("/view", params={"filename": "../x.png"})).status_code == 400
    assert (await http.get("/view", params={"filename": "/etc/passwd"})).status_code == 400
    escape = {"filename": "x.png", "subfolder": "../../"}
    assert (await http.get("/view", params=escape)).status_code == 403
    assert (await http.get("/view", params={"filename": "none.png"})).status_code == 404


async def test_fake_object_info_lists_the_checkpoints(http: httpx.AsyncClient) -> None:
    """/object_info/{class}: ComfyUI's node description, checkpoints as a combo list."""
    info = (await http.get("/object_info/CheckpointLoaderSimple")).json()
    node = info["CheckpointLoaderSimple"]
    assert node["input"]["required"]["ckpt_name"] == [[CHECKPOINT]]
    assert node["output"] == ["MODEL", "CLIP", "VAE"] and node["output_node"] is False


async def test_fake_applies_free_after_the_running_prompt(
    comfy: FakeEngine, http: httpx.AsyncClient
) -> None:
    """POST /free only sets flags: the running prompt keeps its model until it ends."""
    graph = txt2img("[fake:slow]", "quorum/free", steps=8)
    prompt_id = (await http.post("/prompt", json={"prompt": graph})).json()["prompt_id"]

    async def loaded() -> bool:
        return CHECKPOINT in (await http.get("/_fake/comfy")).json()["loaded"]

    await eventually_async(loaded)
    assert (await http.post("/free", json={"unload_models": True})).status_code == 200
    assert await loaded()  # still running with it
    assert (await http.get("/queue")).json()["queue_running"][0][1] == prompt_id

    async def unloaded() -> bool:
        return not await loaded()

    await eventually_async(unloaded)
    assert (await http.get(f"/history/{prompt_id}")).json()[prompt_id]["status"][
        "status_str"
    ] == "success"


BLUR_GRAPH = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 72, "height": 64, "batch_size": 1,
                                                  "color": 0}},
    "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 1, "sigma": 1}},
    "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "quorum/blur/img",
                                                 "images": ["2", 0]}},
}  # fmt: skip


async def test_fake_interrupt_acts_only_when_the_running_node_ends(
    http: httpx.AsyncClient,
) -> None:
    """As ComfyUI 0.3.64 (comfy_compare, docs/engines.md): an interrupt during a node deaf
    to it (ImageBlur) changes nothing until the node ends; the prompt stays in /queue's
    running list meanwhile, then ends interrupted before the next node, the blur executed."""
    await http.post("/_fake/blur", json={"hold": True})
    try:
        prompt_id = (await http.post("/prompt", json={"prompt": BLUR_GRAPH})).json()["prompt_id"]

        async def blurring() -> bool:
            return bool((await http.get("/_fake/comfy")).json()["blurring"])

        await eventually_async(blurring)
        await http.post("/interrupt", json={"prompt_id": prompt_id})
        assert (await http.get("/_fake/comfy")).json()["blurring"]
        assert (await http.get("/queue")).json()["queue_running"][0][1] == prompt_id
        assert (await http.get(f"/history/{prompt_id}")).json() == {}
    finally:
        await http.post("/_fake/blur", json={"hold": False})

    async def ended() -> bool:
        return bool((await http.get(f"/history/{prompt_id}")).json())

    await eventually_async(ended)
    assert (await http.get("/queue")).json()["queue_running"] == []
    status = (await http.get(f"/history/{prompt_id}")).json()[prompt_id]["status"]
    event, data = status["messages"][-1]
    assert event == "execution_interrupted" and data["node_id"] == "3"
    assert "2" in data["executed"]


async def test_fake_legacy_mode_behaves_as_v0_3_64(tmp_path: Path) -> None:
    """--legacy: any prompt_id, a duplicate overwrites, unknown nodes are `invalid_prompt`."""
    with start_fake(
        "fake_comfyui", "--legacy", "--base-directory", str(comfy_base(tmp_path))
    ) as fake:
        async with httpx.AsyncClient(base_url=fake.url, trust_env=False) as http:
            bad = {"prompt": {"1": {"class_type": "Nope", "inputs": {}}}}
            assert (await http.post("/prompt", json=bad)).json()["error"][
                "type"
            ] == "invalid_prompt"
            for _ in range(2):
                answer = await http.post(
                    "/prompt", json={"prompt": model_free("quorum/l"), "prompt_id": "mine"}
                )
                assert answer.status_code == 200 and answer.json()["prompt_id"] == "mine"


def test_fake_blur_time_grows_with_the_batch_pixels() -> None:
    """An ImageBlur of more pixels takes longer, as the real one's does (issue 41)."""
    args = parser().parse_args(["--blur-ms", "50", "--blur-ms-per-mpx", "6000"])
    small, large = blur_ms(args, 128 * 128 / 1e6), blur_ms(args, 640 * 640 / 1e6)
    assert 50 < small < large
    assert large == pytest.approx(50 + 6000 * 0.4096)
    assert blur_ms(parser().parse_args([]), 1.0) == 100.0  # default: a fixed time, as before
