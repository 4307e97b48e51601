"""The multipart form streamed from ASGI receive() to a temporary file, with its limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.http.audio.errors import AudioTooLarge, InvalidForm
from runner.http.audio.multipart import ClientGone, FormLimits, read_form
from tests.runner.http.audio.asgi import Feeder, form

AUDIO = bytes(range(256)) * 400  # 100 KiB, with \r\n and dashes inside


def _limits(tmp_path: Path, max_file: int = 1024 * 1024) -> FormLimits:
    return FormLimits(max_file_bytes=max_file, temp_dir=str(tmp_path))


async def test_multipart_reads_fields_and_spools_the_file(tmp_path: Path) -> None:
    """Fields come back as strings, repeated [] fields as lists, the file byte-exact on disk."""
    body, ctype = form(
        {"model": "whisper-1", "prompt": "héllo", "timestamp_granularities[]": ["word", "segment"]},
        AUDIO,
        "talk.wav",
    )
    upload = await read_form(Feeder(body, chunk=1000), ctype, len(body), _limits(tmp_path))
    try:
        assert upload.fields == {"model": "whisper-1", "prompt": "héllo"}
        assert upload.lists == {"timestamp_granularities[]": ["word", "segment"]}
        assert upload.filename == "talk.wav" and upload.size == len(AUDIO)
        assert Path(upload.path).read_bytes() == AUDIO
        # no suffix from the client: the container is decided by the content alone
        assert Path(upload.path).suffix == "" and Path(upload.path).parent == tmp_path
    finally:
        upload.discard()
    assert not os.listdir(tmp_path)


async def test_multipart_content_length_over_limit_is_413_before_reading(tmp_path: Path) -> None:
    """A Content-Length above the limit is refused without reading a byte."""
    feeder = Feeder(b"x" * 10)
    with pytest.raises(AudioTooLarge) as caught:
        await read_form(
            feeder, b"multipart/form-data; boundary=b", 30 * 1024 * 1024, _limits(tmp_path)
        )
    assert caught.value.status == 413 and feeder.calls == 0


async def test_multipart_stops_reading_once_the_file_passes_the_limit(tmp_path: Path) -> None:
    """A 30 MiB upload without Content-Length is refused at the 1 MiB limit, mid-body;
    the temporary directory never held more than the limit and is empty afterwards."""
    body, ctype = form({"model": "m"}, b"\0" * (30 * 1024 * 1024))
    feeder = Feeder(body, chunk=64 * 1024)
    limits = _limits(tmp_path)
    with pytest.raises(AudioTooLarge):
        await read_form(feeder, ctype, None, limits)
    assert feeder.pulled <= limits.max_body_bytes + feeder.chunk
    assert feeder.pulled < len(body) // 10
    assert not os.listdir(tmp_path)


async def test_multipart_body_over_limit_without_file_is_413(tmp_path: Path) -> None:
    """Parts other than the file count too: the body limit is the file limit plus overhead."""
    body, ctype = form({f"f{i}": "y" * 10_000 for i in range(30)}, b"a")
    limits = FormLimits(max_file_bytes=1000, form_overhead_bytes=1000, temp_dir=str(tmp_path))
    with pytest.raises(AudioTooLarge):
        await read_form(Feeder(body), ctype, None, limits)


async def test_multipart_client_gone_midway_cleans_up(tmp_path: Path) -> None:
    """A disconnect mid-body raises ClientGone and leaves no temporary file behind."""
    body, ctype = form({"model": "m"}, AUDIO)
    feeder = Feeder(body, chunk=4096)
    real = feeder.__call__

    async def receive() -> dict[str, object]:
        if feeder.pulled > len(body) // 2:
            feeder.disconnect()
        return await real()

    with pytest.raises(ClientGone):
        await read_form(receive, ctype, len(body), _limits(tmp_path))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("body", "ctype", "words"),
    [
        (b"{}", b"application/json", "multipart/form-data"),
        (b"x", b"multipart/form-data", "multipart/form-data"),
        (b"--b\r\nnonsense", b"multipart/form-data; boundary=b", "multipart"),
    ],
)
async def test_multipart_not_a_form_is_400(
    tmp_path: Path, body: bytes, ctype: bytes, words: str
) -> None:
    """Not multipart, no boundary, or a body that is no form: 400 saying so."""
    with pytest.raises(InvalidForm) as caught:
        await read_form(Feeder(body), ctype, len(body), _limits(tmp_path))
    assert words in str(caught.value)
    assert not os.listdir(tmp_path)


async def test_multipart_missing_file_is_400_naming_it(tmp_path: Path) -> None:
    """A form without a `file` part (the audio under another name): 400 with param `file`."""
    body, ctype = form({"model": "m"}, AUDIO, part="audio")
    with pytest.raises(InvalidForm) as caught:
        await read_form(Feeder(body), ctype, len(body), _limits(tmp_path))
    assert caught.value.extra["param"] == "file"


async def test_multipart_field_too_long_is_400(tmp_path: Path) -> None:
    """A field over max_field_bytes is refused, naming it."""
    body, ctype = form({"prompt": "p" * 20_000}, AUDIO)
    with pytest.raises(InvalidForm) as caught:
        await read_form(Feeder(body), ctype, len(body), _limits(tmp_path))
    assert caught.value.extra["param"] == "prompt"
    assert not os.listdir(tmp_path)
