"""The runner <-> speech worker messages survive their wire format, and bad frames are refused."""

from __future__ import annotations

import socket
import struct

import pytest

from adapters.whisper import messages as m

SAMPLES: list[m.Message] = [
    m.Transcribe("r1", "/tmp/a.wav", "translate", "fr", "names: Quorum", 0.4, True),
    m.Cancel("r1"),
    m.Shutdown(),
    m.Ready("tiny.en", 850),
    m.Info("r1", 2.6, "en"),
    m.Segment(
        "r1", 1, 0, 0.0, 2.16, " Hello world.", (50363, 18435), 0.0, -0.62, 0.83, 0.04,
        (m.Word(" Hello", 0.0, 0.38, 0.75), m.Word(" world.", 0.38, 0.98, 0.3)),
    ),
    m.Segment("r1", 2, 300, 3.0, 4.0, " Two.", (734,), 0.2, -0.5, 1.0, 0.1, None),
    m.Done("r1", None, 824),
    m.Done("r2", "the audio file could not be decoded", 3, "invalid_audio"),
]  # fmt: skip


@pytest.mark.parametrize("message", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_messages_roundtrip_every_type(message: m.Message) -> None:
    """encode then decode gives back an equal message of the same class."""
    frame = m.encode(message)
    assert m.frame_length(frame[: m.HEADER_SIZE]) == len(frame) - m.HEADER_SIZE
    assert m.decode(frame[m.HEADER_SIZE :]) == message


def test_messages_blocking_helpers_carry_frames_over_a_socket() -> None:
    """send_blocking / recv_blocking move messages in order; EOF reads as None."""
    a, b = socket.socketpair()
    with a, b:
        for message in SAMPLES:
            m.send_blocking(a, message)
        a.shutdown(socket.SHUT_WR)
        got = [m.recv_blocking(b) for _ in SAMPLES]
        assert got == SAMPLES
        assert m.recv_blocking(b) is None


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "Nope"}',
        b'{"type": "Cancel"}',
        b'{"type": "Info", "x": 1}',
    ],
)
def test_messages_decode_refuses_frames_that_are_no_message(payload: bytes) -> None:
    """A frame that is not JSON, names no message type or lacks fields raises ProtocolError."""
    with pytest.raises(m.ProtocolError):
        m.decode(payload)


def test_messages_frame_length_refuses_huge_frames() -> None:
    """A header announcing more than MAX_FRAME bytes is refused before anything is read."""
    with pytest.raises(m.ProtocolError):
        m.frame_length(struct.pack(">I", m.MAX_FRAME + 1))
