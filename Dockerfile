# syntax=docker/dockerfile:1
# The Quorum runner image: the runner, llama-server and the default models (SmolLM2 135M
# Instruct, preloaded, and Gemma 3 270M), started on the embedded default models.yaml.
# Built with the same scripts CI runs
# (scripts/install-llama-server through scripts/install), checked by tests/deploy.
#
#   docker build -t quorum-runner:0.1.0 .
#   docker run -p 8080:8080 quorum-runner:0.1.0
#
# GPU variant (vLLM 0.32.0, the `gpu` extra of pyproject.toml; CUDA comes with its wheels,
# the host needs the NVIDIA driver and container toolkit):
#
#   docker build --build-arg QUORUM_EXTRAS=gpu -t quorum-runner:0.1.0-gpu .
#   docker run --gpus all -e MODELS_CONFIG=/etc/quorum/models.yaml \
#       -v ./models.yaml:/etc/quorum/models.yaml:ro -p 8080:8080 quorum-runner:0.1.0-gpu
#
# deploy/k8s/overlays/gpu runs that image with a vLLM models file.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# pip extras of the runner: none for the CPU image, "gpu" for vLLM (CI installs "dev").
ARG QUORUM_EXTRAS=""
ENV HOME=/home/quorum \
    QUORUM_EXTRAS=${QUORUM_EXTRAS} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# llama-server first: it depends only on its script, so code changes reuse this layer.
# The script installs cmake and g++ itself and caches the build under ~/.cache/quorum.
COPY scripts/install-llama-server scripts/progress.py scripts/
RUN scripts/install-llama-server
COPY pyproject.toml README.md models.yaml ./
# the locks scripts/install installs from (QUORUM_EXTRAS "" -> requirements/lock.txt,
# "gpu" -> requirements/lock-gpu.txt): every package pinned, with its hashes
COPY requirements requirements
COPY scripts scripts
COPY runner runner
COPY governance governance
COPY tenants tenants
COPY adapters adapters
COPY faults faults
COPY client client
# The runner into /app/.venv (its packages from the lock, itself editable, as CI has it:
# models.yaml is found beside the packages) and the default models into
# ~/.cache/quorum/models, where models.yaml points.
RUN scripts/install

FROM ${PYTHON_IMAGE} AS runtime
# tini: a proper init (signals to the runner, zombies reaped); libgomp1: llama-server's
# OpenMP runtime.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini libgomp1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 quorum \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/quorum --create-home quorum \
    && install -d -o quorum -g quorum /home/quorum/.cache
# The code, the engine and the model stay root's (read-only to the runner); the runner's own
# writes go to HOME (e.g. ~/.cache/huggingface) and the temporary directory.
COPY --from=builder /app /app
COPY --from=builder /home/quorum/.cache/quorum /home/quorum/.cache/quorum
ENV HOME=/home/quorum \
    PATH=/app/.venv/bin:${PATH} \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["quorum", "serve"]
