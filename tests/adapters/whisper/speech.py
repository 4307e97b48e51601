"""Real speech for the speech tests: espeak-ng voices, sox edits, the real tiny.en model.

`speech_files(dir)` writes, once per session:

- `hello.wav`: "hello world. one two three." spoken slowly (about 3 s);
- `long-0.wav` (`medium`): a paragraph of seven sentences, under 30 s (one window);
- `long.wav`: two paragraphs and hello.wav joined by sox, about 60 s (kills, cancels);
- `short.wav`: 0.05 s of silence (below OpenAI's 0.1 s minimum);
- `bad.mp3`: an ID3 header followed by random bytes (seeded).

Tests that need them skip, naming what is missing, when espeak-ng or sox is not installed
(`scripts/install-system`); the model is the `whisper_model` fixture's (tests/conftest.py).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.memory.proc import process_tree, resident_kib

HELLO_TEXT = "hello world. one two three."
# Varied sentences: repeated text compresses so well that Whisper's compression-ratio
# check rejects it and retries at every temperature of its ladder, which is slow.
LONG_TEXT = (
    "The morning train left the station at seven. A small dog waited by the gate for its "
    "owner. Farmers carried baskets of apples to the market square. The river was cold and "
    "clear after the spring rain. Children learned to count from one to ten at school. A red "
    "kite flew above the green hill near the old mill. The baker opened his shop and sold warm "
    "bread to the neighbours.",
    "Later that day a storm came from the west with heavy clouds. People closed their windows "
    "and lit candles in the kitchen. By evening the sky was calm again and the stars came out. "
    "An old man told stories about ships, islands and distant mountains. The library keeps maps "
    "of every road in the country. Music played in the park while families ate dinner on the "
    "grass. At night the town was quiet, and the lamps glowed softly along the street.",
)
ROBUST_WORDS = ("hello", "world", "one", "two", "three")


@dataclass(frozen=True)
class SpeechFiles:
    hello: Path
    medium: Path
    long: Path
    short: Path
    bad_mp3: Path


def speech_files(directory: Path) -> SpeechFiles:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/install-system)")
    files = SpeechFiles(
        directory / "hello.wav",
        directory / "long-0.wav",
        directory / "long.wav",
        directory / "short.wav",
        directory / "bad.mp3",
    )
    _run("espeak-ng", "-s", "120", "-w", str(files.hello), HELLO_TEXT)
    halves = [directory / f"long-{i}.wav" for i in range(len(LONG_TEXT))]
    for half, text in zip(halves, LONG_TEXT, strict=True):
        _run("espeak-ng", "-s", "140", "-w", str(half), text)
    _run("sox", *map(str, halves), str(files.hello), str(files.long))
    _run("sox", "-n", "-r", "16000", "-c", "1", str(files.short), "trim", "0.0", "0.05")
    files.bad_mp3.write_bytes(b"ID3" + random.Random(7).randbytes(200_000))
    return files


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def has_words(text: str, words: tuple[str, ...] = ROBUST_WORDS, at_least: int = 3) -> bool:
    """At least `at_least` of `words` occur in `text` (tiny.en hears espeak only roughly)."""
    lowered = text.lower()
    return sum(w in lowered for w in words) >= at_least


def tree_rss_bytes(root: int | None = None) -> int:
    """Resident memory of `root` (default: this process) and all its descendants."""
    return sum(resident_kib(pid) for pid in process_tree([root or os.getpid()])) * 1024
