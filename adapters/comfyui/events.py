"""ComfyUI's job events and history entries, read into small frozen values (pure).

What ComfyUI sends (`server.py` `send_json`: `{"type": ..., "data": ...}`; per-job events go
only to the socket whose `clientId` submitted the prompt, `execution.py` / `main.py`), in
order for one prompt::

    execution_start {prompt_id}            execution_cached {nodes, prompt_id}
    per node run:   executing {node, display_node, prompt_id}
                    progress {value, max, prompt_id, node}     (samplers, per step)
                    executed {node, display_node, output: {images: [...]}, prompt_id}
    then one of:    execution_success {prompt_id}
                    execution_error {prompt_id, node_id, node_type, exception_message,
                                     exception_type, traceback, ...}
                    execution_interrupted {prompt_id, node_id, node_type, executed}
    end marker:     executing {node: null, prompt_id}    (after the history entry is written)

`status`, `progress_state` and binary preview frames carry nothing this adapter needs.
`GET /history/{id}` holds the verdict once the prompt ended: its entry's
`{"status": {"status_str"}}` is `success` or `error`, and an interrupted prompt also reads
`error`: it is told apart by an `execution_interrupted` entry in `{"status": {"messages"}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

Verdict = Literal["success", "error", "interrupted"]


@dataclass(frozen=True, slots=True)
class Event:
    """One websocket JSON message."""

    type: str
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """Where ComfyUI saved an image (the `/view` query)."""

    filename: str
    subfolder: str = ""
    type: str = "output"


@dataclass(frozen=True, slots=True)
class ExecutionFailure:
    """An `execution_error`, without its traceback and inputs."""

    node_id: str
    node_type: str
    exception_type: str
    exception_message: str

    def describe(self) -> str:
        message = self.exception_message.strip().splitlines()
        first = message[0] if message else ""
        return f"node {self.node_id} ({self.node_type}) raised {self.exception_type}: {first}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a prompt ended."""

    verdict: Verdict
    images: tuple[ImageRef, ...] = ()
    failure: ExecutionFailure | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """What the websocket has told about one prompt so far."""

    started: bool = False
    node: str | None = None
    step: tuple[float, float] | None = None
    done_nodes: frozenset[str] = field(default_factory=frozenset)
    images: tuple[ImageRef, ...] = ()
    verdict: Verdict | None = None
    failure: ExecutionFailure | None = None
    ended: bool = False

    def outcome(self) -> Outcome | None:
        """The outcome the events alone give (used when history has no entry)."""
        if self.verdict is None:
            return None
        return Outcome(self.verdict, self.images, self.failure)

    def sampling(self) -> float | None:
        """The running node's own progress (its steps done / its steps, 0..1): where the
        time of a prompt goes (the sampler); None while no running node reports steps."""
        if self.step is None or self.node is None or self.node in self.done_nodes:
            return None
        value, maximum = self.step
        return min(1.0, max(0.0, value / maximum)) if maximum > 0 else None

    def progress(self, total_nodes: int) -> tuple[float, float]:
        """(done, total) in workflow nodes; the running node counts its sampler steps."""
        done = float(len(self.done_nodes))
        if self.step is not None and self.node is not None and self.node not in self.done_nodes:
            value, maximum = self.step
            if maximum > 0:
                done += min(1.0, max(0.0, value / maximum))
        total = float(max(total_nodes, 1))
        if self.ended or self.verdict == "success":
            done = total
        return min(done, total), total


def parse_message(message: str | bytes) -> Event | None:
    """A text frame as an `Event`; binary preview frames and anything malformed: None."""
    if isinstance(message, bytes):
        return None
    try:
        obj = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    data = obj.get("data")
    return Event(obj["type"], data if isinstance(data, dict) else {})


def about(event: Event, prompt_id: str) -> bool:
    """Whether `event` is ComfyUI saying something about `prompt_id` (pure): every per-job
    event carries it (`progress_state` too); `status`, the `executing` resent on reconnect
    and binary previews do not."""
    return event.data.get("prompt_id") == prompt_id


def fold(view: JobView, event: Event, prompt_id: str) -> JobView:
    """The view after `event`.

    1. Events of other prompts, and events without a prompt id (`status`, the `executing`
       resent on reconnect), change nothing.
    2. `execution_start`: started. `execution_cached`: those nodes are done.
    3. `executing` with a node: the previous node is done, this one runs;
       with `node: null`: the end marker.
    4. `progress`: the running node's step.
    5. `executed`: the node is done; its saved images are kept.
    6. `execution_success` / `execution_error` / `execution_interrupted`: the verdict.
    7. Anything else changes nothing.
    """
    data = event.data
    if not about(event, prompt_id):  # 1
        return view
    kind = event.type
    if kind == "execution_start":  # 2
        return replace(view, started=True)
    if kind == "execution_cached":
        nodes = data.get("nodes")
        cached = frozenset(str(n) for n in nodes) if isinstance(nodes, list) else frozenset()
        return replace(view, started=True, done_nodes=view.done_nodes | cached)
    if kind == "executing":  # 3
        node = data.get("node")
        if node is None:
            return replace(view, ended=True, node=None, step=None)
        done = view.done_nodes if view.node is None else view.done_nodes | {view.node}
        return replace(view, started=True, node=str(node), step=None, done_nodes=done)
    if kind == "progress":  # 4
        value, maximum = data.get("value"), data.get("max")
        if isinstance(value, int | float) and isinstance(maximum, int | float):
            return replace(view, step=(float(value), float(maximum)))
        return view
    if kind == "executed":  # 5
        node = str(data.get("node"))
        images = view.images + images_of(data.get("output"))
        return replace(view, done_nodes=view.done_nodes | {node}, images=images)
    if kind == "execution_success":  # 6
        return replace(view, verdict="success")
    if kind == "execution_error":
        return replace(view, verdict="error", failure=failure_of(data))
    if kind == "execution_interrupted":
        return replace(view, verdict="interrupted")
    return view  # 7


def images_of(output: object) -> tuple[ImageRef, ...]:
    """The saved (`type: output`) images of one node's UI output; previews are skipped."""
    if not isinstance(output, Mapping):
        return ()
    refs = []
    for item in output.get("images") or ():
        if not isinstance(item, Mapping) or not isinstance(item.get("filename"), str):
            continue
        kind = str(item.get("type", "output"))
        if kind != "output":
            continue
        refs.append(ImageRef(item["filename"], str(item.get("subfolder", "")), kind))
    return tuple(refs)


def failure_of(data: Mapping[str, Any]) -> ExecutionFailure:
    return ExecutionFailure(
        node_id=str(data.get("node_id", "?")),
        node_type=str(data.get("node_type", "?")),
        exception_type=str(data.get("exception_type", "Exception")),
        exception_message=str(data.get("exception_message", "")),
    )


def outcome_from_history(entry: object) -> Outcome | None:
    """How the prompt ended, from its `/history/{id}` entry; None while it has none.

    1. No entry (pending, running, unknown, or dropped from the capped history): None.
    2. Saved images: every output node's `images` of type `output`, in history order.
    3. `status_str` `success`: success.
    4. `error` with an `execution_interrupted` message: interrupted.
    5. `error` with an `execution_error` message: error, with the node's failure.
    6. Anything else (no status, `error` without a message): error, no failure detail.
    """
    if not isinstance(entry, Mapping):  # 1
        return None
    images: tuple[ImageRef, ...] = ()
    outputs = entry.get("outputs")
    if isinstance(outputs, Mapping):  # 2
        for node_output in outputs.values():
            images += images_of(node_output)
    status = entry.get("status")
    status_str = status.get("status_str") if isinstance(status, Mapping) else None
    if status_str == "success":  # 3
        return Outcome("success", images)
    messages = status.get("messages") if isinstance(status, Mapping) else None
    for item in messages if isinstance(messages, list) else ():
        if not isinstance(item, list | tuple) or len(item) < 2:
            continue
        name, data = item[0], item[1]
        if name == "execution_interrupted":  # 4
            return Outcome("interrupted", images)
        if name == "execution_error" and isinstance(data, Mapping):  # 5
            return Outcome("error", images, failure_of(data))
    return Outcome("error", images)  # 6
