"""Errors of the ComfyUI adapter, and the one place httpx's failures are translated.

Exception tree::

    QuorumError (faults)
    ├── BadRequest                       400  invalid_request_error
    │   ├── InvalidImageRequest          400  invalid_image_request: the images facet's row
    │   │                                      (adapters/errors.py), raised here too
    │   ├── InvalidWorkflowParameter     400  invalid_workflow_parameter: a template parameter
    │   │                                      is missing, mistyped or out of its bounds
    │   └── WorkflowRejected             400  comfyui_workflow_rejected: ComfyUI answered 400
    │       │                                  (`no_prompt`, `invalid_prompt`/`missing_node_type`,
    │       │                                  `prompt_no_outputs`, `prompt_outputs_failed_
    │       │                                  validation`); node errors in message and extra
    │       └── WorkflowPartlyRejected   400  comfyui_outputs_failed_validation: a 200 that
    │                                          carried `node_errors` (some outputs dropped)
    ├── EngineError (adapters)           502
    │   ├── EngineUnavailable            502  connection refused / reset (from httpx)
    │   ├── EngineTimeout                504  no answer in time (from httpx)
    │   │   └── EngineSilent             504  engine_timeout: no event about the prompt for
    │   │                                      ENGINE_READ_TIMEOUT_S (`follow.py`); the
    │   │                                      prompt is removed or interrupted at ComfyUI
    │   ├── EngineBadResponse            502  not the JSON/PNG ComfyUI's API promises
    │   ├── EngineCrashed                502  engine_crashed: ComfyUI's process died under it
    │   ├── ExecutionFailed              502  comfyui_execution_error: a node raised
    │   │                                      (`execution_error`: node, type, message)
    │   ├── ExecutionInterrupted         502  comfyui_interrupted: interrupted by someone else
    │   └── PromptVanished               502  comfyui_prompt_vanished: neither queued, running
    │                                          nor in history (deleted by another client)
    └── ComfyUINotReady (503 faults)     503  comfyui_not_ready: the model is not loaded here
    DuplicatePromptId                         internal: a 409 on submit (v0.38+), retried

`translate_http` is the only place httpx exceptions become engine errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from adapters.errors import EngineBadResponse, EngineError, EngineTimeout, EngineUnavailable
from faults import BadRequest, ServiceUnavailable

InvalidWorkflowParameter = BadRequest.row("InvalidWorkflowParameter", "invalid_workflow_parameter")
ExecutionFailed = EngineError.row("ExecutionFailed", "comfyui_execution_error")
ExecutionInterrupted = EngineError.row("ExecutionInterrupted", "comfyui_interrupted")
PromptVanished = EngineError.row("PromptVanished", "comfyui_prompt_vanished")
ComfyUINotReady = ServiceUnavailable.row("ComfyUINotReady", "comfyui_not_ready")


class WorkflowRejected(BadRequest):
    """ComfyUI refused the workflow: its error and per-node errors, without tracebacks."""

    code = "comfyui_workflow_rejected"
    extra_fields = ("comfyui_error", "node_errors")

    def __init__(self, error: Mapping[str, Any], node_errors: Mapping[str, Any]) -> None:
        self.error_type = str(error.get("type", "unknown"))
        self.node_errors = summarize_node_errors(node_errors)
        super().__init__(
            describe_rejection(error, self.node_errors),
            comfyui_error=self.error_type,
            node_errors=self.node_errors,
        )


class WorkflowPartlyRejected(WorkflowRejected):
    code = "comfyui_outputs_failed_validation"


class DuplicatePromptId(Exception):
    """ComfyUI answered 409 `duplicate_prompt_id` (v0.38+): send again with a fresh id."""


def summarize_node_errors(node_errors: Mapping[str, Any]) -> dict[str, Any]:
    """Per node: class_type and its errors' type/message/details (no tracebacks, no inputs)."""
    out: dict[str, Any] = {}
    for node_id, entry in node_errors.items():
        if not isinstance(entry, Mapping):
            continue
        errors = []
        for e in entry.get("errors", ()):
            if isinstance(e, Mapping):
                errors.append(
                    {k: str(e.get(k, "")) for k in ("type", "message", "details") if k in e}
                )
        out[str(node_id)] = {"class_type": str(entry.get("class_type", "")), "errors": errors}
    return out


def describe_rejection(error: Mapping[str, Any], node_errors: Mapping[str, Any]) -> str:
    """One readable line per problem: ComfyUI's error, then each node's errors."""
    kind = error.get("type", "unknown")
    parts = [f"ComfyUI refused the workflow ({kind}): {error.get('message', '')}".rstrip()]
    details = error.get("details")
    if details and not node_errors:
        parts.append(str(details))
    for node_id, entry in node_errors.items():
        for e in entry.get("errors", ()):
            text = f"node {node_id} ({entry.get('class_type', '?')}): {e.get('type', '?')}"
            if e.get("details"):
                text += f": {e['details']}"
            elif e.get("message"):
                text += f": {e['message']}"
            parts.append(text)
    return "; ".join(parts)


def translate_http(exc: httpx.HTTPError, what: str) -> EngineError:
    """Map a failed HTTP exchange with ComfyUI (`what` names it) to a runner error."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return EngineTimeout(f"ComfyUI did not answer {what} in time")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return EngineUnavailable(f"ComfyUI is unreachable ({what})")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return EngineUnavailable(f"ComfyUI closed the connection ({what})")
    return EngineBadResponse(f"ComfyUI failed {what}: {type(exc).__name__}")
