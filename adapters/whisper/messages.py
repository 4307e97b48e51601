"""Every message between the runner and a speech worker process, in one module.

Runner -> worker: `Transcribe`, `Cancel`, `Shutdown`.
Worker -> runner: `Ready` (once, after the model loaded), then per request `Info`
(once), `Segment` (zero or more, in order) and `Done` (exactly once, last).

`Info` and `Segment` (with its `Word`s) are the speech facet's own data
(adapters/speech.py), framed here as they are.

A request the worker refuses (undecodable audio, unknown language) or fails on
still ends with `Done`, its `error` set: failures are data, the worker lives on.

Wire format: frames of a 4-byte big-endian length, then a JSON object with a
`type` key naming the class. JSON, not msgpack: orjson is already a runner
dependency, the frames are readable in a packet dump, and the rate is a few
frames per second of audio, so encoding cost does not matter.

The channel is a Unix socket in a private (0700) directory that the runner
listens on and the worker connects to (see `engine.py` for why not stdout).
"""

from __future__ import annotations

import dataclasses
import socket
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from adapters.speech import Info, Segment, Word

MAX_FRAME = 16 * 1024 * 1024
_LENGTH = struct.Struct(">I")
HEADER_SIZE = _LENGTH.size


class ProtocolError(Exception):
    """A frame that is not one of the messages below (a bug or a corrupt stream)."""


# -- runner -> worker --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Transcribe (or translate to English) the audio file at `audio_path`.

    `temperature` None uses faster-whisper's fallback ladder (0.0 ... 1.0), as
    OpenAI's 0 does; a positive value samples at that temperature only. `traceparent`:
    the runner's span for it (W3C trace context), which the worker's log lines about the
    request name (`trace_id=`); None when the runner does not trace.
    """

    request_id: str
    audio_path: str
    task: str = "transcribe"  # "transcribe" | "translate"
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    word_timestamps: bool = False
    traceparent: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop `request_id` at the next segment; the worker still answers `Done`."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop serving and exit (the runner also ends the process group afterwards)."""


# -- worker -> runner --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The model is loaded; `load_ms` is how long that took."""

    model: str
    load_ms: int


@dataclass(frozen=True, slots=True)
class Done:
    """The request ended. `error` is None on success; `error_code` says which failure:

    - `invalid_audio`: the file could not be decoded (the client's fault);
    - `unsupported_language`: the model does not know `language`;
    - `cancelled`: a `Cancel` stopped it;
    - `engine_error`: anything else inside faster-whisper / CTranslate2.
    `engine_ms` is the worker's wall time on this request.
    """

    request_id: str
    error: str | None
    engine_ms: int
    error_code: str | None = None


Message = Transcribe | Cancel | Shutdown | Ready | Info | Segment | Done

_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls for cls in (Transcribe, Cancel, Shutdown, Ready, Info, Segment, Done)
}


def encode(message: Message) -> bytes:
    """One frame: length, then `{"type": ..., **fields}` as JSON."""
    fields = {"type": type(message).__name__}
    fields.update({f.name: getattr(message, f.name) for f in dataclasses.fields(message)})
    payload = orjson.dumps(fields)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(payload)} bytes is over the {MAX_FRAME} limit")
    return _LENGTH.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    """The payload length a 4-byte header announces (refusing absurd ones)."""
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes announced; the limit is {MAX_FRAME}")
    return int(length)


def decode(payload: bytes) -> Message:
    """The message a frame's payload holds; `ProtocolError` when it holds none."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    cls = _TYPES.get(obj.pop("type", None))
    if cls is None:
        raise ProtocolError("frame names no known message type")
    if cls is Segment:
        obj["tokens"] = tuple(obj.get("tokens") or ())
        words = obj.get("words")
        if words is not None:
            try:
                obj["words"] = tuple(Word(**w) for w in words)
            except TypeError as exc:
                raise ProtocolError(f"bad word in Segment: {exc}") from None
    try:
        message: Message = cls(**obj)
    except TypeError as exc:
        raise ProtocolError(f"bad {cls.__name__} frame: {exc}") from None
    return message


# -- blocking helpers (the worker side) --------------------------------------------


def send_blocking(sock: socket.socket, message: Message) -> None:
    sock.sendall(encode(message))


def recv_blocking(sock: socket.socket) -> Message | None:
    """The next message, or None when the peer closed the connection."""
    header = _recv_exactly(sock, HEADER_SIZE)
    if header is None:
        return None
    payload = _recv_exactly(sock, frame_length(header))
    if payload is None:
        return None
    return decode(payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
