"""A process tree for the memory tests: this program, and one child of its own.

Run without arguments it starts the child (`--leaf`), prints the child's pid,
then obeys one command per stdin line, answering `ok` when done:

- `self`: allocate and touch 50 MiB here.
- `leaf`: have the child allocate and touch 50 MiB.

EOF on stdin ends both. No sleeps: the test reads the answer, then measures.
"""

from __future__ import annotations

import subprocess
import sys

CHUNK = 50 * 1024 * 1024


def leaf() -> None:
    held: list[bytes] = []
    for line in sys.stdin:
        if line.strip() == "alloc":
            held.append(b"\x01" * CHUNK)  # written, so resident
            print("ok", flush=True)


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--leaf"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    print(child.pid, flush=True)
    held: list[bytes] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "self":
            held.append(b"\x01" * CHUNK)
        elif command == "leaf":
            child.stdin.write("alloc\n")
            child.stdin.flush()
            child.stdout.readline()
        print("ok", flush=True)
    child.stdin.close()
    child.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["--leaf"]:
        leaf()
    else:
        main()
