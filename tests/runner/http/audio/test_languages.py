"""The language table matches faster-whisper's codes."""

from __future__ import annotations

import pytest

from runner.http.audio.languages import LANGUAGES, language_name


def test_languages_are_faster_whispers() -> None:
    """Every code faster-whisper's tokenizer knows has a name, and no other code does."""
    tokenizer = pytest.importorskip("faster_whisper.tokenizer")
    assert set(LANGUAGES) == set(tokenizer._LANGUAGE_CODES)


def test_languages_name_falls_back_to_the_code() -> None:
    """A known code gives OpenAI's name; an unknown one gives itself."""
    assert language_name("en") == "english" and language_name("zz") == "zz"
