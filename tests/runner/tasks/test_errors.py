"""The load-task errors answer in the runner's error envelope with their documented status."""

from __future__ import annotations

import orjson

from faults import QuorumError
from runner.errors import HTTP_ERRORS, error_body, error_headers, error_status
from runner.tasks.errors import (
    IllegalTaskTransition,
    TaskError,
    TaskNotCancellable,
    TaskNotFound,
    TaskStoreUnavailable,
)


def test_errors_tree_roots_in_runner_error() -> None:
    """Every task error is a QuorumError, so request handlers already catch it."""
    for cls in (TaskNotFound, IllegalTaskTransition, TaskNotCancellable, TaskStoreUnavailable):
        assert issubclass(cls, TaskError)
        assert issubclass(cls, QuorumError)
    assert issubclass(TaskNotCancellable, IllegalTaskTransition)
    assert isinstance(TaskNotFound("load-1"), HTTP_ERRORS)


def test_errors_not_found_is_404_with_task_id() -> None:
    """TaskNotFound answers 404 task_not_found and names the task id."""
    exc = TaskNotFound(taskId="load-abc")
    assert error_status(exc) == 404
    body = orjson.loads(error_body(exc))["error"]
    assert body["code"] == "task_not_found"
    assert body["taskId"] == "load-abc"
    assert body["type"] == "invalid_request_error"


def test_errors_not_cancellable_is_409_with_a_client_message() -> None:
    """TaskNotCancellable answers 409 and says the task already finished."""
    exc = TaskNotCancellable(taskId="load-abc", status="completed")
    assert error_status(exc) == 409
    body = orjson.loads(error_body(exc))["error"]
    assert body["code"] == "task_not_cancellable"
    assert body["status"] == "completed"
    assert "already completed" in body["message"]


def test_errors_store_unavailable_is_503_with_retry_after() -> None:
    """TaskStoreUnavailable answers 503 task_store_unavailable with a Retry-After header."""
    exc = TaskStoreUnavailable(detail="ConnectionError")
    assert error_status(exc) == 503
    assert orjson.loads(error_body(exc))["error"]["code"] == "task_store_unavailable"
    assert error_headers(exc) == {"Retry-After": "1"}


def test_errors_illegal_transition_stays_internal() -> None:
    """An IllegalTaskTransition is a bug: 500 with the generic message, internals not shown."""
    exc = IllegalTaskTransition(taskId="load-abc", current="completed", target="loading")
    assert error_status(exc) == 500
    body = orjson.loads(error_body(exc))["error"]
    assert body == {"code": "internal_error", "message": "internal error", "type": "server_error"}
