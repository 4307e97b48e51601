"""The runner served by granian instead of uvicorn: the ASGI-server choice, measured.

    python -m bench.proxy.granian_runner      (the same environment as `python -m runner`)

Builds the runner's app exactly as `quorum serve` does (`runner/cli.py`), then serves it
with granian's embedded ASGI server (Rust HTTP/1, one runtime thread, uvloop) in place of
uvicorn with httptools and `GuardedHttpToolsProtocol`. The client limits of
`runner/http_limits.py` (431/408, connection bound) are not there: a measurement of the
server, not a way to run the runner. Compared with
`bench.proxy.compare --before HEAD --after HEAD --after-module bench.proxy.granian_runner`.
"""

from __future__ import annotations

import os
import sys

import uvloop
from granian.constants import Interfaces
from granian.server.embed import Server

from governance.errors import ConfigInvalid
from runner.app import build_app
from runner.errors import ConfigError
from runner.governance import governance_from
from runner.logs import configure
from runner.models_config import default_models_path, load_models_file
from runner.settings import load_settings
from tenants.config import build_config
from tenants.errors import InvalidTenantConfig


def main() -> int:
    try:
        settings = load_settings()
        models = load_models_file(settings.models_config or default_models_path())
        tenants = build_config(os.environ, settings.tenants_file)
        verifier = governance_from(settings)
    except (ConfigError, InvalidTenantConfig, ConfigInvalid) as exc:
        print(f"granian_runner: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_format)
    app = build_app(settings, models, tenants, verifier)
    server = Server(
        app, address=settings.host, port=settings.port, interface=Interfaces.ASGI,
        log_enabled=False,
    )  # fmt: skip
    uvloop.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
