"""A separate 'runner' process for the shared-Redis test: verify one token when told to go.

    python -m tests.governance.verify_once REDIS_URL TOKEN_FILE
Prints "ready", waits for a line on stdin, authorizes the token, prints the HTTP status.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from governance.audit import MemoryAuditSink
from governance.errors import GovernanceError
from governance.nonces import RedisNonceStore
from governance.verifier import Verifier
from tests.governance.support import MODEL, OPERATION, PARAMS, RUNNER, Clock, make_registry


async def main(url: str, token_file: str) -> int:
    store = RedisNonceStore.from_url(url)
    verifier = Verifier(make_registry(), store, MemoryAuditSink(), RUNNER, Clock())
    raw = Path(token_file).read_text()
    await store.consume("warm-up-connection-" + "a" * 8 + str(id(store)), 1)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        await verifier.authorize(raw, OPERATION, MODEL, dict(PARAMS))
        status = 200
    except GovernanceError as exc:
        status = exc.status
    print(status, flush=True)
    await verifier.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
