"""The bench's audio set: English speech made by espeak-ng, 3 to 28 s per file.

Varied sentences (repeated text compresses so well that Whisper's compression-ratio check
retries at every temperature, which would measure the fallback ladder, not the runner).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import av

TEXTS = (
    "hello world. one two three.",
    "Please send the quarterly report to the finance team before Friday afternoon.",
    "The morning train left the station at seven. A small dog waited by the gate for its "
    "owner, and farmers carried baskets of apples to the market square.",
    "Later that day a storm came from the west with heavy clouds. People closed their "
    "windows and lit candles in the kitchen. By evening the sky was calm again.",
    "An old man told stories about ships, islands and distant mountains. The library keeps "
    "maps of every road in the country, and students read them on rainy afternoons. Music "
    "played in the park while families ate dinner on the grass.",
    "Our meeting starts at nine thirty. First we review the budget, then the hiring plan, "
    "and finally the schedule for the product launch in the spring.",
    "The river was cold and clear after the spring rain. Children learned to count from one "
    "to ten at school. A red kite flew above the green hill near the old mill. The baker "
    "opened his shop and sold warm bread to the neighbours. At night the town was quiet, and "
    "the lamps glowed softly along the street.",
    "Turn left at the second light, then drive two miles until you see the blue sign.",
)
VOICES = ("en-us", "en", "en-us", "en-gb-x-rp")
SPEEDS = (120, 140, 160, 150)


def audio_set(directory: Path) -> list[tuple[Path, float]]:
    """Write the set as 16 kHz WAV files; each file with its duration in seconds."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (scripts/install-system)")
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for i, text in enumerate(TEXTS):
        path = directory / f"speech-{i}.wav"
        voice, speed = VOICES[i % len(VOICES)], SPEEDS[i % len(SPEEDS)]
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text],
            check=True,
            capture_output=True,
        )
        files.append((path, duration_s(path)))
    return files


def duration_s(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        assert stream.duration is not None and stream.time_base is not None
        return float(stream.duration * stream.time_base)
