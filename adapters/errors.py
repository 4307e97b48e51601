"""Errors of the engines: talking to them, starting them, and what they refuse.

The adapters, the supervisor and the engine HTTP client raise these; the runner answers
them through its one mapping (`runner/errors.py`). Foreign failures are translated once:
the engine client's in `adapters/http_client.py` (`engine_call`), httpx's for ComfyUI in
`adapters/comfyui/errors.py`, the speech worker's in `adapters/whisper/errors.py`; an
engine's own refusal (any answer but 200) in `adapters/refusals.py`.

Exception tree::

    QuorumError (faults)
    ├── EngineError                502  engine_error: the engine failed
    │   ├── EngineUnavailable      502  engine_unavailable: refused or reset before an answer
    │   ├── EngineBadResponse      502  engine_bad_response: not the HTTP/JSON it promises
    │   ├── EngineCrashed          502  engine_crashed: the engine process died (exit code,
    │   │                               signal)
    │   ├── EngineControlFailed    502  engine_control_failed: a control call (sleep, wake
    │   │                               up, cache reset) failed or was refused
    │   ├── EngineRefused          502  engine_refused: the engine refused the runner (its
    │   │                               401, 403, 404, ...; field `engineStatus`)
    │   ├── EngineReplaced         503  engine_restarting: the runner stopped this engine
    │   │                               for the one that replaced it (a LoRA adapter
    │   │                               change) under a request past the drain timeout;
    │   │                               the chat path retries it once on the new engine
    │   │                               when nothing was sent yet; Retry-After
    │   └── EngineTimeout          504  engine_timeout: no answer in time
    │       └── EngineSilent       504  engine_timeout: nothing heard about a request for
    │                                   ENGINE_READ_TIMEOUT_S while the engine still held it
    │                                   (ComfyUI's prompt, a speech worker's transcription);
    │                                   the runner then freed the engine (interrupt, kill)
    ├── EngineStartFailed          503  engine_start_failed: exited while starting, or not
    │   │                               healthy within the load timeout (field `exit_code`)
    │   └── EngineOutOfMemory      503  engine_out_of_memory: no GPU memory at start
    ├── EngineBusy                 503  engine_busy: the engine said 429 / 503 (busy,
    │                                   loading); Retry-After
    ├── UnsupportedRequest (400)        unsupported_parameter: a field the engine cannot
    │                                   serve safely, or its 501 (BadRequest)
    ├── EngineRejected (400)            invalid_request: the engine refused the request
    │                                   (its 400 / 422; field `param`)
    ├── InvalidAudio (400)              invalid_audio: undecodable or not audio (a speech
    │                                   engine's refusal, or the runner's probe; `param`)
    ├── UnsupportedLanguage (400)       unsupported_language: a language the speech model
    │                                   does not know (`param`)
    ├── InvalidImageRequest (400)       invalid_image_request: a field of the OpenAI image
    │                                   request (size, n, response_format, ...) is wrong
    ├── ImageNotFound (404)             image_not_found: no stored image for a URL token
    │                                   (never was, or expired)
    ├── ContextLengthExceeded (400)     context_length_exceeded: prompt or max_tokens over
    │                                   the context (fields `promptTokens`, `contextLength`)
    └── AdapterConfigInvalid            invalid_configuration: a template or flag the
                                        adapter cannot use (start-up only; ConfigError)
    IllegalEngineTransition             a bug: a state change the supervisor forbids
"""

from __future__ import annotations

from faults import BadRequest, ConfigError, NotFound, QuorumError, ServiceUnavailable


class EngineError(QuorumError):
    """Root of the engine failures a request can meet."""

    status, code, type = 502, "engine_error", "server_error"


EngineUnavailable = EngineError.row("EngineUnavailable", "engine_unavailable")
EngineBadResponse = EngineError.row("EngineBadResponse", "engine_bad_response")
EngineCrashed = EngineError.row("EngineCrashed", "engine_crashed")
EngineControlFailed = EngineError.row("EngineControlFailed", "engine_control_failed")
EngineTimeout = EngineError.row("EngineTimeout", "engine_timeout", 504)
EngineSilent = EngineTimeout.row("EngineSilent", "engine_timeout")
EngineRefused = EngineError.row("EngineRefused", "engine_refused")
EngineReplaced = EngineError.row(
    "EngineReplaced",
    "engine_restarting",
    503,
    "model {model!r}: its engine was replaced while this request was on it; retry shortly",
    retry_after=True,
    defaults={"retry_after": 1},
)


class EngineStartFailed(ServiceUnavailable):
    """The engine exited while starting or was not healthy in time (fields `exit_code`,
    and `log`: its output, kept out of the message)."""

    code = "engine_start_failed"

    @property
    def exit_code(self) -> int | None:
        code = self.fields.get("exit_code")
        return code if isinstance(code, int) else None

    @property
    def log(self) -> list[str]:
        """The engine's last output lines (for admins and the runner's log, never a tenant)."""
        lines = self.fields.get("log")
        return [str(line) for line in lines] if isinstance(lines, list) else []


EngineOutOfMemory = EngineStartFailed.row("EngineOutOfMemory", "engine_out_of_memory")
UnsupportedRequest = BadRequest.row("UnsupportedRequest", "unsupported_parameter")
EngineRejected = BadRequest.row("EngineRejected", "invalid_request")
ContextLengthExceeded = BadRequest.row("ContextLengthExceeded", "context_length_exceeded")
InvalidAudio = BadRequest.row(
    "InvalidAudio", "invalid_audio", extra=("param",), defaults={"param": "file"}
)
UnsupportedLanguage = BadRequest.row(
    "UnsupportedLanguage", "unsupported_language", extra=("param",), defaults={"param": "language"}
)
InvalidImageRequest = BadRequest.row("InvalidImageRequest", "invalid_image_request")
ImageNotFound = NotFound.row("ImageNotFound", "image_not_found")
EngineBusy = ServiceUnavailable.row(
    "EngineBusy",
    "engine_busy",
    503,
    "the engine of model {model!r} is busy or loading ({said}); retry in {retry_after} s",
    retry_after=True,
)
AdapterConfigInvalid = ConfigError.row("AdapterConfigInvalid", "invalid_configuration")


class IllegalEngineTransition(RuntimeError):
    """A state change the supervisor's table forbids (always a bug)."""
