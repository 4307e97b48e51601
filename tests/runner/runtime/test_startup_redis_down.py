"""A runner whose Redis does not answer at start-up refuses to start (docs/operations.md,
"When Redis is down"; docs/reliability.md, section 10): it must mark the load tasks and jobs
its previous life left unfinished, and cannot."""

from __future__ import annotations

import pytest

from tests.support import forkserver
from tests.support.ports import free_port


@pytest.mark.timeout(60)
def test_redis_down_at_start_exits_3_naming_the_store() -> None:
    """REDIS_URL pointing at a port nobody listens on: exit code 3, the unreachable store
    named in the log."""
    env = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}",
        "PORT": str(free_port()),
        "PATH": "/usr/bin:/bin",
    }
    proc = forkserver.run("runner", env=env, timeout=45)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert b"store unreachable" in proc.stderr
