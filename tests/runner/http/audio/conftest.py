"""Session-wide speech files and a runner process serving the real tiny.en model (the
`whisper_model` fixture of tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.adapters.whisper.speech import SpeechFiles, speech_files
from tests.runner.http.audio.runner_kit import SECRET, whisper_models_file
from tests.support.runner_proc import RunnerProcess, start_runner


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFiles:
    """espeak-ng speech, a 60 s recording, a too-short and a corrupt file."""
    return speech_files(tmp_path_factory.mktemp("speech"))


@dataclass(frozen=True)
class SpeechRunner:
    runner: RunnerProcess
    tmp: Path  # the runner's TMPDIR: where uploads are spooled

    @property
    def url(self) -> str:
        return self.runner.url


@pytest.fixture(scope="session")
def speech_runner(
    whisper_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SpeechRunner]:
    """`python -m runner` with model `whisper` (tiny.en, 2 parallel, preloaded, restarted
    when its worker dies) and a webhook secret, loopback receivers allowed; uploads spool
    in its own TMPDIR."""
    tmp = tmp_path_factory.mktemp("runner-tmp")
    models = whisper_models_file(whisper_model, parallel=2, preload=True, restart=True)
    env = {"WEBHOOK_SECRET": SECRET, "WHISPER_CPU_THREADS": "1", "TMPDIR": str(tmp)}
    env["WEBHOOK_ALLOW_HOSTS"] = "127.0.0.1/32"  # the tests' receivers are on loopback
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        yield SpeechRunner(runner, tmp)
