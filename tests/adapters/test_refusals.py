"""adapters/refusals.py: every engine refusal becomes the runner's envelope, message made safe."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.refusals import MAX_MESSAGE, refusal, safe_message
from runner.errors import error_body, error_headers, error_status
from runner.http.openapi.components import ERROR_STATUSES
from tests.fixtures import _vllm_checks as vllm_checks
from tests.fixtures import _vllm_shapes as vllm_shapes

pytestmark = pytest.mark.timeout(30)

LLAMA_CONTEXT = {
    "error": {
        "code": 400,
        "message": "request (1566 tokens) exceeds the available context size (512 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 1566,
        "n_ctx": 512,
    }
}


def _envelope(status: int, body: object) -> tuple[int, dict[str, object]]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    error = refusal(status, raw, "m")
    answer = orjson.loads(error_body(error))["error"]
    return error_status(error), answer


def test_refusal_llama_context_is_context_length_exceeded() -> None:
    """llama-server's prompt over the context is 400 context_length_exceeded with its figures."""
    status, error = _envelope(400, LLAMA_CONTEXT)
    assert status == 400
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "exceeds the available context size (512 tokens)" in str(error["message"])
    assert error["promptTokens"] == 1566 and error["contextLength"] == 512


def test_refusal_vllm_bodies_take_the_same_path() -> None:
    """The vLLM fake's refusals (context, validation, unknown model) become the envelope."""
    code, body = vllm_checks.check_prompt(100, 32) or (0, {})
    assert _envelope(code, body)[1]["code"] == "context_length_exceeded"
    code, body = vllm_checks.check_request({"stream_options": {"x": 1}}, ["m"], 64) or (0, {})
    status, error = _envelope(code, body)
    assert (status, error["code"], error["param"]) == (400, "invalid_request", "stream_options")
    code, body = vllm_checks.check_request({"model": "other"}, ["m"], 64) or (0, {})
    status, error = _envelope(code, body)
    assert (status, error["code"], error["engineStatus"]) == (502, "engine_refused", 404)
    status, error = _envelope(400, vllm_shapes.pydantic_error("missing", "body.messages", "x", 1))
    assert status == 400 and "\n" not in str(error["message"])


@pytest.mark.parametrize(
    ("engine_status", "status", "code"),
    [
        (401, 502, "engine_refused"),
        (413, 413, "payload_too_large"),
        (422, 400, "invalid_request"),
        (429, 503, "engine_busy"),
        (501, 400, "unsupported_parameter"),
        (503, 503, "engine_busy"),
        (504, 504, "engine_timeout"),
        (500, 502, "engine_error"),
    ],
)
def test_refusal_status_maps_to_a_documented_row(
    engine_status: int, status: int, code: str
) -> None:
    """Each engine status maps to one runner row with a string code."""
    body = {"error": {"code": engine_status, "message": "no", "type": "x"}}
    assert _envelope(engine_status, body)[:1] == (status,)
    assert _envelope(engine_status, body)[1]["code"] == code


def test_refusal_busy_engine_says_retry_after() -> None:
    """An engine still loading (503 unavailable_error) gives 503 engine_busy with Retry-After."""
    body = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    error = refusal(503, orjson.dumps(body), "m")
    assert error_headers(error)["Retry-After"] == "1"
    assert "Loading model" in str(error)


def test_refusal_other_shapes_are_read() -> None:
    """FastAPI's detail, vLLM's top-level fields, plain text and HTML bodies all give a message."""
    assert "bad field" in str(refusal(400, b'{"detail": "bad field"}', "m"))
    top = {"object": "error", "message": "top level", "type": "BadRequestError", "code": 400}
    assert "top level" in str(refusal(400, orjson.dumps(top), "m"))
    assert "plain words" in str(refusal(400, b"plain words", "m"))
    assert "HTTP 502" in str(refusal(502, b"<html><body>Bad Gateway</body></html>", "m"))


def test_safe_message_drops_paths_and_request_ids() -> None:
    """File paths and request ids leave the message; it is one line, cut to MAX_MESSAGE."""
    text = (
        "failed to open /home/op/.cache/models/x.gguf\nfor chatcmpl-abc123def456 "
        "(task 0f8fad5b-d9cb-469f-a165-70867728950e) " + "z" * 500
    )
    safe = safe_message(text)
    assert "/home" not in safe and "x.gguf" not in safe and "abc123" not in safe
    assert "0f8fad5b" not in safe and "\n" not in safe
    assert len(safe) <= MAX_MESSAGE


@given(
    status=st.integers(min_value=300, max_value=599),
    payload=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda m, t, c: orjson.dumps({"error": {"message": m, "type": t, "code": c}}),
            st.text(max_size=400),
            st.one_of(st.none(), st.text(max_size=20)),
            st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=5)),
        ),
    ),
)
def test_refusal_always_answers_a_documented_envelope(status: int, payload: bytes) -> None:
    """Whatever the engine answered, the client gets a documented status and a string code,
    on one line, no longer than the cut message plus the runner's prefix."""
    error = refusal(status, payload, "m")
    assert error_status(error) in ERROR_STATUSES
    answer = orjson.loads(error_body(error))["error"]
    assert isinstance(answer["code"], str) and isinstance(answer["type"], str)
    assert "\n" not in answer["message"] and len(answer["message"]) <= MAX_MESSAGE + 120
