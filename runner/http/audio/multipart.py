"""The audio API's `multipart/form-data` body, streamed from ASGI `receive()` to disk.

`python-multipart`'s streaming `MultipartParser` is fed each chunk as it arrives;
the `file` part goes straight to a temporary file, other parts (`model`, `language`,
...) are kept as short strings. The body is never held whole in memory, and never
stored whole when it is too large:

- a `Content-Length` above the limit is refused (413) before anything is read;
- the `file` part is refused (413) the moment it passes `max_file_bytes`, and the
  whole body the moment it passes that plus `form_overhead_bytes` (the other fields
  and the part headers), so the temporary directory never holds more than the limit;
- on any refusal the temporary file is deleted before the error leaves.

`max_file_bytes` is OpenAI's 25 MiB (26,214,400 bytes) unless configured.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import IO, Any

from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header

from runner.http.asgi import ClientGone
from runner.http.audio.errors import AudioTooLarge, InvalidForm

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

OPENAI_MAX_FILE_BYTES = 26_214_400


@dataclass(frozen=True, slots=True)
class FormLimits:
    max_file_bytes: int = OPENAI_MAX_FILE_BYTES
    form_overhead_bytes: int = 64 * 1024
    max_field_bytes: int = 16 * 1024
    max_parts: int = 32
    temp_dir: str | None = None

    @property
    def max_body_bytes(self) -> int:
        return self.max_file_bytes + self.form_overhead_bytes


@dataclass(slots=True)
class AudioUpload:
    """A parsed form: the audio in a temporary file (delete it with `discard()`)."""

    path: str
    filename: str
    size: int
    fields: dict[str, str] = field(default_factory=dict)  # last value wins
    lists: dict[str, list[str]] = field(default_factory=dict)  # names ending in []

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def boundary_of(content_type: bytes | None) -> bytes:
    """The multipart boundary, or `InvalidForm` when the body is not multipart/form-data."""
    ctype, params = parse_options_header(content_type or b"")
    boundary = params.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise InvalidForm("Content-Type must be multipart/form-data with a boundary")
    return boundary


async def read_form(
    receive: Receive,
    content_type: bytes | None,
    content_length: int | None,
    limits: FormLimits,
) -> AudioUpload:
    """Read the whole form from `receive`, the `file` part to disk.

    1. `Content-Length` above the body limit: `AudioTooLarge` before reading.
    2. Not multipart/form-data with a boundary: `InvalidForm`.
    3. Feed each chunk to the parser; a client that goes away raises `ClientGone`;
       passing a limit raises `AudioTooLarge` at once.
    4. The body must end at the closing boundary, with exactly one `file` part.
    Any failure deletes the temporary file.
    """
    if content_length is not None and content_length > limits.max_body_bytes:  # 1
        raise AudioTooLarge(limit=limits.max_file_bytes)
    boundary = boundary_of(content_type)  # 2
    form = _Form(limits)
    parser = MultipartParser(boundary, form.callbacks())
    try:
        received = 0
        more = True
        while more:  # 3
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            more = bool(message.get("more_body", False))
            received += len(chunk)
            if received > limits.max_body_bytes:
                raise AudioTooLarge(limit=limits.max_file_bytes)
            if chunk:
                try:
                    parser.write(chunk)
                except FormParserError as exc:
                    raise InvalidForm(f"the multipart body is malformed: {exc}") from None
        parser.finalize()
        return form.result()  # 4
    except BaseException:
        form.discard()
        raise


class _Form:
    """The parser's callbacks: part headers, field values, the file's bytes."""

    def __init__(self, limits: FormLimits) -> None:
        self.limits = limits
        self.fields: dict[str, str] = {}
        self.lists: dict[str, list[str]] = {}
        self.parts = 0
        self.ended = False
        self.path: str | None = None
        self.filename = ""
        self.size = 0
        self._file: IO[bytes] | None = None
        self._headers: dict[bytes, bytes] = {}
        self._hname = bytearray()
        self._hvalue = bytearray()
        self._name: str | None = None
        self._value = bytearray()
        self._to_file = False
        self._file_done = False

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._hname.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._hvalue.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > self.limits.max_parts:
            raise InvalidForm(f"the form has more than {self.limits.max_parts} parts")
        self._headers = {}
        self._name = None
        self._value = bytearray()
        self._to_file = False

    def _header_end(self) -> None:
        self._headers[bytes(self._hname).lower()] = bytes(self._hvalue)
        self._hname.clear()
        self._hvalue.clear()

    def _headers_finished(self) -> None:
        disposition, params = parse_options_header(self._headers.get(b"content-disposition"))
        if disposition != b"form-data" or b"name" not in params:
            return  # a part without a field name is skipped
        name = params[b"name"].decode("utf-8", "replace")
        if name != "file" and b"filename" in params:
            return  # another file part: not ours, its bytes are dropped
        self._name = name
        if self._name == "file":
            if self._file_done or self._file is not None:
                raise InvalidForm("the form has more than one 'file' part", param="file")
            self.filename = params.get(b"filename", b"audio").decode("utf-8", "replace")
            self._open_file()
            self._to_file = True

    def _open_file(self) -> None:
        # No suffix from the client: FFmpeg picks demuxers by name too (`.m3u8`: HLS), and
        # the container is decided by the content alone (runner/http/audio/probe.py).
        fd, self.path = tempfile.mkstemp(prefix="quorum-audio-", dir=self.limits.temp_dir)
        self._file = os.fdopen(fd, "wb")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._to_file:
            assert self._file is not None
            self.size += end - start
            if self.size > self.limits.max_file_bytes:
                raise AudioTooLarge(limit=self.limits.max_file_bytes)
            self._file.write(data[start:end])
        elif self._name is not None:
            self._value.extend(data[start:end])
            if len(self._value) > self.limits.max_field_bytes:
                raise InvalidForm(
                    f"the {self._name!r} field is longer than {self.limits.max_field_bytes} bytes",
                    param=self._name,
                )

    def _part_end(self) -> None:
        if self._to_file:
            assert self._file is not None
            self._file.close()
            self._file = None
            self._file_done = True
            return
        if self._name is None:
            return
        try:
            value = self._value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidForm(
                f"the {self._name!r} field is not UTF-8 text", param=self._name
            ) from None
        if self._name.endswith("[]"):
            self.lists.setdefault(self._name, []).append(value)
        else:
            self.fields[self._name] = value

    def _end(self) -> None:
        self.ended = True

    def result(self) -> AudioUpload:
        if not self.ended:
            raise InvalidForm("the multipart body ended before its closing boundary")
        if not self._file_done or self.path is None:
            raise InvalidForm("the 'file' field is required", param="file")
        return AudioUpload(self.path, self.filename, self.size, self.fields, self.lists)

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
