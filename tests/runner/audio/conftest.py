"""Session-wide speech files and the real tiny.en model for the audio API tests."""

from __future__ import annotations

import pytest

from tests.adapters.whisper.speech import SpeechFiles, model_path, speech_files


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFiles:
    """espeak-ng speech, a 60 s recording, a too-short and a corrupt file."""
    return speech_files(tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="session")
def whisper_model() -> str:
    """The real Whisper tiny.en CTranslate2 directory."""
    return model_path()
