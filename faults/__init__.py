"""Errors as data: the one base every package's errors derive from.

Each package declares its errors in its `errors.py` as a table: one row per error,

    QueueFull = SchedulerError.row(
        "QueueFull", "queue_full", 503,
        "Queue depth {queueDepth}/{maxDepth}, retry in {retry_after} seconds",
        extra=("queueDepth", "avgWaitMs"), retry_after=True,
    )

giving its name, machine `code`, HTTP `status`, message template and the fields that
ride in the error envelope. A row is an exception class (a subclass of the package's
root), so `raise QueueFull(queueDepth=16, maxDepth=16, avgWaitMs=40, retry_after=5)`,
`except QueueFull` and `isinstance` work as with any class. Raising with a message
(`raise BadRequest("modelId is required")`) uses it instead of the template.

What a row carries, and how the runner's one mapping (`runner/errors.py`) reads it:

    status    HTTP status (4xx/5xx); 500 means internal: its message is never shown
    code      the envelope's `code`
    type      the envelope's `type` (OpenAI's: invalid_request_error, server_error, ...)
    message   `str(exc)`: the template filled with the fields, or the message given
    extra     envelope fields: the row's `extra` names, taken from the fields (a row's
              `defaults` fill fields the raise leaves out)
    headers   response headers: `Retry-After` from the `retry_after` field when the row
              says so, and the row's `headers` templates filled with the fields

This package imports no other project package, so every layer can declare errors. It
also holds `record` (faults/record.py), the decorator of the records built per request.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Mapping
from typing import ClassVar, TypeVar

E = TypeVar("E", bound="QuorumError")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}


class _Fields(dict[str, object]):
    """A template's fields; one the raise left out reads as its name in braces, so a
    mistake shows in the message instead of failing the error that reports another."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class QuorumError(Exception):
    """Root of every error a client can be answered with; see the module docstring."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    type: ClassVar[str] = "server_error"
    template: ClassVar[str] = "internal error"
    extra_fields: ClassVar[tuple[str, ...]] = ()
    header_templates: ClassVar[Mapping[str, str]] = {}
    retry_after: ClassVar[bool] = False
    field_defaults: ClassVar[Mapping[str, object]] = {}

    def __init__(
        self,
        message: str | None = None,
        /,
        *,
        extra: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
        **fields: object,
    ) -> None:
        fields = {**self.field_defaults, **fields}
        text = self.template.format_map(_Fields(fields)) if message is None else message
        super().__init__(text)
        self.fields: dict[str, object] = fields
        self.extra: dict[str, object] = {k: fields[k] for k in self.extra_fields if k in fields}
        self.extra.update(extra or {})
        self.headers: dict[str, str] = {}
        if self.retry_after and "retry_after" in fields:
            self.headers["Retry-After"] = str(fields["retry_after"])
        for name, template in self.header_templates.items():
            self.headers[name] = template.format_map(_Fields(fields))
        self.headers.update(headers or {})

    @classmethod
    def row(
        cls: builtins.type[E],
        name: str,
        code: str,
        status: int | None = None,
        template: str | None = None,
        *,
        error_type: str | None = None,
        extra: tuple[str, ...] = (),
        headers: Mapping[str, str] | None = None,
        retry_after: bool | None = None,
        defaults: Mapping[str, object] | None = None,
    ) -> builtins.type[E]:
        """One row of a package's error table: a subclass of `cls` named `name`.

        What the row leaves out it inherits from `cls`; a new status without an
        `error_type` takes OpenAI's type for it (400 invalid_request_error, 401
        authentication_error, 403 permission_error, other 4xx invalid_request_error,
        5xx server_error).
        """
        attrs: dict[str, object] = {
            "code": code,
            "__module__": sys._getframe(1).f_globals["__name__"],
        }
        if status is not None:
            attrs["status"] = status
            if error_type is None:
                error_type = _TYPES.get(
                    status, "invalid_request_error" if status < 500 else "server_error"
                )
        if error_type is not None:
            attrs["type"] = error_type
        if template is not None:
            attrs["template"] = template
        if extra:
            attrs["extra_fields"] = cls.extra_fields + extra
        if headers is not None:
            attrs["header_templates"] = {**cls.header_templates, **headers}
        if retry_after is not None:
            attrs["retry_after"] = retry_after
        if defaults is not None:
            attrs["field_defaults"] = {**cls.field_defaults, **defaults}
        made: builtins.type[E] = builtins.type(name, (cls,), attrs)
        return made


# The generic errors every layer raises with a message of its own; each package's table
# adds its specific rows (runner/errors.py, adapters/errors.py, tenants/errors.py, ...).
# Classes rather than rows, so that an error with behaviour of its own can subclass them.


class BadRequest(QuorumError):
    status, code, type = 400, "invalid_request", "invalid_request_error"


class Forbidden(QuorumError):
    status, code, type = 403, "forbidden", "permission_error"


class NotFound(QuorumError):
    status, code, type = 404, "not_found", "invalid_request_error"


class PayloadTooLarge(QuorumError):
    status, code, type = 413, "payload_too_large", "invalid_request_error"


class ServiceUnavailable(QuorumError):
    status, code, type = 503, "service_unavailable", "server_error"


class ConfigError(QuorumError):
    """Invalid configuration found at start-up; the message names the setting (never a
    response)."""

    code = "invalid_configuration"
