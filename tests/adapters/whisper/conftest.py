"""Session-wide speech files for the speech-worker tests (the model: tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.adapters.whisper.speech import SpeechFiles, speech_files


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFiles:
    """espeak-ng speech, a 60 s recording, a too-short and a corrupt file."""
    return speech_files(tmp_path_factory.mktemp("speech"))
