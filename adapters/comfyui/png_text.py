"""The text chunks of a PNG: ComfyUI's SaveImage writes the whole graph (the prompt
included) into each image; the runner hands images out without them (pure)."""

from __future__ import annotations

import struct

TEXT_CHUNKS = frozenset({b"tEXt", b"zTXt", b"iTXt"})


def without_text_chunks(data: bytes) -> bytes:
    """The PNG without its tEXt, zTXt and iTXt chunks (ComfyUI's `prompt`, `workflow`, ...);
    anything that is not a well-formed PNG comes back unchanged (pure)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return data
    out, i = [data[:8]], 8
    while i + 12 <= len(data):
        (length,) = struct.unpack(">I", data[i : i + 4])
        end = i + 12 + length
        if end > len(data):
            return data
        if data[i + 4 : i + 8] not in TEXT_CHUNKS:
            out.append(data[i:end])
        i = end
    return b"".join(out) if i == len(data) else data
