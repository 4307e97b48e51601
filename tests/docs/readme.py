"""The README's tested blocks, read from README.md itself (tests/docs/test_readme.py).

A block is tested when the line before its opening fence is `<!-- tested: ... -->`. In a
shell block each command (a line, with its `\\` continuations) runs on its own, and a
`# →` line is text the command before it must print; in a Python block the code runs
whole and its `# →` lines must appear in its output, in order. `localhost:8080` is where
the runner listens; the test puts its own address there (commands and expectations alike).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TESTED = re.compile(r"^<!-- tested:[^\n]*-->\n```(\w+)\n(.*?)^```", re.S | re.M)
EXPECT = "# →"
ADDRESS = "localhost:8080"


@dataclass(frozen=True)
class Block:
    lang: str
    text: str


@dataclass
class Command:
    text: str
    expect: list[str] = field(default_factory=list)


def tested_blocks(readme: str, address: str = ADDRESS) -> list[Block]:
    """The tested blocks in README order, `localhost:8080` replaced by `address`."""
    return [Block(m[1], m[2].replace(ADDRESS, address)) for m in TESTED.finditer(readme)]


def shell_commands(block: Block) -> list[Command]:
    """A shell block's commands, each with the `# →` lines that follow it."""
    commands: list[Command] = []
    pending: list[str] = []
    for line in block.text.splitlines():
        stripped = line.strip()
        if stripped.startswith(EXPECT):
            assert commands and not pending, f"{EXPECT} before any command: {line}"
            commands[-1].expect.append(stripped.removeprefix(EXPECT).strip())
        elif pending or (stripped and not stripped.startswith("#")):
            pending.append(line)
            if not line.endswith("\\"):
                commands.append(Command("\n".join(pending)))
                pending = []
    assert not pending, f"a command ends in a continuation: {pending}"
    return commands


def python_expectations(block: Block) -> list[str]:
    """A Python block's `# →` lines, in order."""
    lines = (line.strip() for line in block.text.splitlines())
    return [line.removeprefix(EXPECT).strip() for line in lines if line.startswith(EXPECT)]


def in_order(output: str, expected: list[str]) -> list[str]:
    """The expectations missing from `output` (each searched after the one before)."""
    missing, at = [], 0
    for text in expected:
        found = output.find(text, at)
        if found < 0:
            missing.append(text)
        else:
            at = found + len(text)
    return missing
