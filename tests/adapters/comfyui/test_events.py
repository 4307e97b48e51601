"""ComfyUI's websocket events and history entries, read into a view and an outcome."""

from __future__ import annotations

from typing import Any

import orjson

from adapters.comfyui.events import (
    Event,
    ExecutionFailure,
    ImageRef,
    JobView,
    fold,
    outcome_from_history,
    parse_message,
)

PID = "0f6c2f4e-6a35-4c53-9d9a-1b2f3c4d5e6f"
IMAGE = {"filename": "j_00001_.png", "subfolder": "quorum", "type": "output"}


def _events(*pairs: tuple[str, dict[str, Any]]) -> JobView:
    view = JobView()
    for kind, data in pairs:
        view = fold(view, Event(kind, data), PID)
    return view


def test_fold_follows_a_successful_prompt_to_its_end_marker() -> None:
    """Start, nodes, sampler steps, saved images, verdict, end marker: all in the view."""
    view = _events(
        ("execution_start", {"prompt_id": PID}),
        ("execution_cached", {"nodes": ["4"], "prompt_id": PID}),
        ("executing", {"node": "3", "prompt_id": PID}),
        ("progress", {"value": 5, "max": 10, "prompt_id": PID, "node": "3"}),
    )
    assert view.started and view.node == "3"
    assert view.progress(4) == (1.5, 4.0)  # node 4 cached, half of node 3
    view = _events(
        ("execution_start", {"prompt_id": PID}),
        ("executing", {"node": "3", "prompt_id": PID}),
        ("executing", {"node": "9", "prompt_id": PID}),
        ("executed", {"node": "9", "output": {"images": [IMAGE]}, "prompt_id": PID}),
        ("execution_success", {"prompt_id": PID}),
        ("executing", {"node": None, "prompt_id": PID}),
    )
    assert view.ended and view.verdict == "success"
    assert view.images == (ImageRef("j_00001_.png", "quorum", "output"),)
    assert view.progress(4) == (4.0, 4.0)


def test_fold_ignores_other_prompts_and_unattributed_events() -> None:
    """Events of another prompt, `status`, and the reconnect `executing` change nothing."""
    view = _events(
        ("executing", {"node": None, "prompt_id": "another"}),
        ("status", {"status": {"exec_info": {"queue_remaining": 2}}}),
        ("executing", {"node": "3"}),
        ("execution_error", {"prompt_id": "another", "node_id": "3"}),
    )
    assert view == JobView()


def test_fold_keeps_saved_images_only() -> None:
    """Preview images (`type: temp`) are not results."""
    temp = {**IMAGE, "type": "temp"}
    view = _events(
        ("executed", {"node": "9", "output": {"images": [temp, IMAGE]}, "prompt_id": PID})
    )
    assert [i.type for i in view.images] == ["output"]


def test_fold_reads_an_execution_error() -> None:
    """An `execution_error` becomes the verdict with node, type and message."""
    data = {
        "prompt_id": PID,
        "node_id": "6",
        "node_type": "CLIPTextEncode",
        "exception_type": "RuntimeError",
        "exception_message": "boom\n",
        "traceback": ["..."],
    }
    view = _events(("execution_error", data))
    assert view.verdict == "error"
    assert view.failure == ExecutionFailure("6", "CLIPTextEncode", "RuntimeError", "boom\n")
    assert view.failure.describe() == "node 6 (CLIPTextEncode) raised RuntimeError: boom"


def test_history_success_lists_saved_images() -> None:
    """`status_str: success`: success, with every output node's saved images."""
    entry = {
        "prompt": [0, PID, {}, {}, ["9"]],
        "outputs": {"9": {"images": [IMAGE, {**IMAGE, "filename": "j_00002_.png"}]}},
        "status": {"status_str": "success", "completed": True, "messages": []},
    }
    outcome = outcome_from_history(entry)
    assert outcome is not None and outcome.verdict == "success"
    assert [i.filename for i in outcome.images] == ["j_00001_.png", "j_00002_.png"]


def test_history_interrupted_reads_error_with_an_interrupt_message() -> None:
    """An interrupted prompt reads `status_str: error`; its messages tell it apart."""
    messages = [
        ["execution_start", {"prompt_id": PID, "timestamp": 1}],
        ["execution_interrupted", {"prompt_id": PID, "node_id": "3", "timestamp": 2}],
    ]
    entry = {
        "outputs": {},
        "status": {"status_str": "error", "completed": False, "messages": messages},
    }
    outcome = outcome_from_history(entry)
    assert outcome is not None and outcome.verdict == "interrupted"


def test_history_error_carries_the_failure() -> None:
    """`execution_error` in the messages gives the failing node."""
    error = {
        "prompt_id": PID,
        "node_id": "3",
        "node_type": "KSampler",
        "exception_type": "torch.OutOfMemoryError",
        "exception_message": "CUDA OOM",
    }
    entry = {
        "outputs": {},
        "status": {"status_str": "error", "messages": [["execution_error", error]]},
    }
    outcome = outcome_from_history(entry)
    assert outcome is not None and outcome.verdict == "error"
    assert outcome.failure is not None and outcome.failure.node_type == "KSampler"


def test_history_without_an_entry_is_not_an_outcome() -> None:
    """No entry yet (pending, running, unknown): None."""
    assert outcome_from_history(None) is None


def test_parse_message_skips_binary_and_malformed_frames() -> None:
    """Preview frames are binary; a frame that is not `{type, data}` is skipped."""
    assert parse_message(b"\x00\x00\x00\x01jpeg") is None
    assert parse_message("not json") is None
    assert parse_message('{"data": {}}') is None
    event = parse_message(orjson.dumps({"type": "progress", "data": {"value": 1}}).decode())
    assert event == Event("progress", {"value": 1})
