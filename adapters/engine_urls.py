"""Where an engine listens: a TCP URL, or a Unix domain socket.

An engine may listen on a Unix domain socket instead of a TCP port (a vLLM the runner
starts: only the runner's user can connect to it). Its URL is then `unix_url(path)`,
`http+unix://<the socket's path, percent-encoded>`; the data path's client
(adapters/http_client.py, `EngineConnections`) connects to the socket, `control_client`
builds the httpx client for the engine's control routes over it, and `split_unix` gives
both.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import httpx

UNIX_SCHEME = "http+unix"


def unix_url(path: str) -> str:
    """The URL of an engine listening on the Unix socket `path`."""
    return f"{UNIX_SCHEME}://{quote(path, safe='')}"


def split_unix(url: str) -> tuple[str | None, str]:
    """(the socket's path, the URL as HTTP asks it) for a `unix_url` (and a path after it);
    (None, url) for any other URL."""
    if not url.startswith(UNIX_SCHEME + "://"):
        return None, url
    rest = url[len(UNIX_SCHEME) + 3 :]
    socket_part, slash, path = rest.partition("/")
    return unquote(socket_part), "http://localhost" + slash + path


def control_client(url: str, **kwargs: Any) -> httpx.AsyncClient:
    """An httpx client whose `base_url` is the engine at `url` (a Unix socket included),
    never through a proxy."""
    sock, base = split_unix(url)
    transport = httpx.AsyncHTTPTransport(uds=sock) if sock is not None else None
    return httpx.AsyncClient(base_url=base, transport=transport, trust_env=False, **kwargs)
