"""The one door into uvicorn's private httptools protocol, and the versions it was tested on.

The runner's connections are served by subclasses of uvicorn's `HttpToolsProtocol`
(`uvicorn.protocols.http.httptools_impl`), which is no public API: coalesced writes
(runner/http/coalesce.py) and the client limits (runner/http/limits.py) override its
`connection_made`, `connection_lost`, `data_received`, `on_headers_complete`,
`on_message_complete`, `on_response_complete` and `resume_writing`; they read its
`transport`, `parser`, `cycle`, `flow`, `pipeline`, `headers`, `url`, `scope`,
`server_state` and `logger`, call `_should_upgrade`, `_unsupported_upgrade_warning`,
`handle_websocket_upgrade`, `send_400_response` and `_start_asgi_task`, and write refusals
with its `STATUS_LINE`. Any uvicorn release may change those, and the data path with them.

So the private names are imported here only (tests/runner/http/test_uvicorn_seam.py checks that
no other module imports `uvicorn.protocols`), and `quorum serve` refuses to start, exit 2,
on a uvicorn this seam was not tested with (`check_uvicorn`, from runner/runtime/cli.py),
naming the version found and the ones tested. The lock (requirements/) installs a tested
one; tests/test_lock.py keeps the two one. To move to a new uvicorn: `scripts/upgrade
uvicorn`, read the diff of `httptools_impl.py` against the overrides above, add the
version to `TESTED_UVICORN` and run the client-limit and coalescing tests.
"""

from __future__ import annotations

from collections.abc import Collection

import uvicorn

from runner.errors import ConfigError

TESTED_UVICORN: tuple[str, ...] = ("0.54.0",)
"""uvicorn versions the overrides of runner/http/limits.py and coalesce.py were tested on."""


def untested_uvicorn(found: str, tested: Collection[str] = TESTED_UVICORN) -> str | None:
    """Why the runner must not serve with uvicorn `found`; None when it was tested with it.

    1. `found` is one of `tested`: None.
    2. Otherwise the refusal, naming `found`, the tested versions and the way out.
    """
    if found in tested:  # 1
        return None
    return (  # 2
        f"uvicorn {found} is installed, but the runner's HTTP protocol subclasses uvicorn's "
        f"private httptools protocol (runner/http/uvicorn_seam.py) and was tested with uvicorn "
        f"{', '.join(tested)} only: install from the lock (scripts/install) or test the seam "
        f"on {found} and add it to TESTED_UVICORN"
    )


def check_uvicorn(found: str | None = None) -> None:
    """Raise ConfigError (exit 2 at start-up) when `found` (default: the installed uvicorn)
    is not a tested one."""
    problem = untested_uvicorn(found or uvicorn.__version__)
    if problem is not None:
        raise ConfigError(problem)


try:  # a uvicorn that moved its private protocol is refused by name, not by a traceback
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
except ImportError as exc:  # pragma: no cover - only on an untested uvicorn
    raise ConfigError(untested_uvicorn(uvicorn.__version__) or str(exc)) from exc

__all__ = ["STATUS_LINE", "TESTED_UVICORN", "HttpToolsProtocol", "check_uvicorn"]
