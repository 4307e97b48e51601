"""Shared fixtures: a real Redis per test that asks for one; the real engines, whose
fixtures mark a test `real_engine` (tests/support/real_engines.py); the artefacts kept, listed."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Generator, Iterator

import pytest
from httpx._types import CertTypes

from tests.support import forkserver, real_engines, real_vllm, runner_proc, xdist_groups
from tests.support.real_engines import LlamaServer
from tests.support.real_vllm import require_vllm
from tests.support.redis_cluster import RedisClusterGroup, running_cluster
from tests.support.redis_server import RedisServer, running_redis

_STARTED = time.time()
"""When this session began (conftest is imported before any test runs)."""


def _share_one_tls_context() -> None:
    """httpx builds a TLS context for every client it makes (certifi's bundle: ~20 ms of CPU),
    so for every `httpx.get(...)`; the tests poll local plain-HTTP processes thousands of
    times, so in this process they share one default context. Nothing else changes (the
    runner and the engines are other processes)."""
    from httpx._config import create_ssl_context as make
    from httpx._transports import default

    if getattr(default, "create_ssl_context", None) is not make:  # httpx moved it: say so
        raise RuntimeError("httpx._transports.default no longer calls create_ssl_context")
    shared = make()

    def create(
        verify: ssl.SSLContext | str | bool = True,
        cert: CertTypes | None = None,
        trust_env: bool = True,
    ) -> ssl.SSLContext:
        if verify is True and cert is None:
            return shared
        return make(verify=verify, cert=cert, trust_env=trust_env)

    default.create_ssl_context = create  # type: ignore[attr-defined]  # what its clients call


_share_one_tls_context()
# the runners and fake engines the tests start are forked (tests/support/forkserver.py)
os.environ.setdefault("QUORUM_TEST_FORK", "1")
# a runner, fake or helper the tests start that dies of a fatal signal (SIGSEGV, SIGABRT...)
# prints its Python stacks into its log (forked ones too: tests/support/forkserver.py)
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
# engines inherit an allow-listed environment (adapters/environment.py): the stand-ins of
# tests/fixtures/ read their knobs (FAKE_*) and coverage its own from it
os.environ.setdefault("ENGINE_ENV_ALLOW", "FAKE_*,COV_CORE_*,COVERAGE_*,QUORUM_TEST_*")
# the runners the tests start keep vLLM's model-class inspection between its starts
# (adapters/vllm/kind.py `keep_model_info`): about 17 real vLLM starts in the full run
os.environ.setdefault("VLLM_MODEL_INFO_DIR", str(real_vllm.MODEL_INFO_DIR))


@pytest.fixture(scope="session")
def _redis_cluster_session() -> Iterator[RedisClusterGroup]:
    with running_cluster() as group:
        yield group


@pytest.fixture
def redis_cluster(_redis_cluster_session: RedisClusterGroup) -> RedisClusterGroup:
    """A three-primary Redis Cluster (one per test session), emptied for each test."""
    _redis_cluster_session.flush()
    return _redis_cluster_session


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, stopped after the test."""
    with running_redis() as server:
        yield server


@pytest.fixture(scope="session")
def real_llama_server() -> LlamaServer:
    """The llama-server build and the GGUFs of scripts/install (marks the test)."""
    return real_engines.llama_server()


@pytest.fixture(scope="session")
def real_vllm() -> None:
    """vLLM's CPU build and its converted model, from scripts/install-vllm (marks the test)."""
    require_vllm()


@pytest.fixture(scope="session")
def whisper_model() -> str:
    """The real Whisper tiny.en CTranslate2 directory (marks the test)."""
    return real_engines.whisper_model()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `real_engine` every test that asks for a real engine's fixture or has a
    parameter that is one (`real_engine = True`), and give each test its group for
    pytest-xdist's `--dist loadgroup` (scripts/test; `real_engines.xdist_group`): the tests
    that start the real vLLM share one worker, one at a time; the other real-engine tests
    another, one at a time; every other test goes with its module, whose module fixtures (a
    runner, an engine) then start once. Run first, so that the hooks turning the groups
    into the scheduler's units (pytest-xdist's, tests/support/xdist_groups.py) see them."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {}).values()
        fixtures = getattr(item, "fixturenames", ())
        group = real_engines.xdist_group(item.nodeid, fixtures, params)
        if group in (real_engines.GROUP_VLLM, real_engines.GROUP_OTHERS):
            item.add_marker(real_engines.MARKER)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: whether it may reach a real engine (and so starts its
    runners anew rather than forked: tests/support/forkserver.py)."""
    real = item.get_closest_marker(real_engines.MARKER) is not None
    real_engines.set_current_test(real)
    forkserver.popen_only(real)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report says of every runner still held (its own, its module's)
    whether it runs or how it ended: "Server disconnected" from a runner that died reads
    differently from one that closed the connection."""
    report = yield
    left = runner_proc.LEFT_ON_ERROR[:]
    runner_proc.LEFT_ON_ERROR.clear()
    if report.failed:  # only then: a runner's state is a poll, an ended one's a log read
        states = [*left, *(r.state() for r in runner_proc.LIVE)]
        if states:
            report.sections.append(("runners", "\n".join(states)))
    return report


def pytest_configure(config: pytest.Config) -> None:
    """The groups `pytest_collection_modifyitems` gives reach pytest-xdist's scheduler
    (tests/support/xdist_groups.py)."""
    config.pluginmanager.register(xdist_groups.Suffixes(), "quorum-xdist-group-suffixes")


def pytest_unconfigure(config: pytest.Config) -> None:
    """This process's fork server ends with it."""
    forkserver.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the artefacts (screenshots) this session kept, by this process or by its
    pytest-xdist workers, so CI logs show where they are."""
    from tests.support.artefacts import kept_since

    for path in kept_since(_STARTED):
        terminalreporter.write_line(f"artefact kept: {path}")
