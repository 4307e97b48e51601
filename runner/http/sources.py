"""Open connections per source address (MAX_CONNECTIONS_PER_SOURCE), so that one address
holding idle sockets, reopened as they time out, cannot take every place MAX_CONNECTIONS
leaves (Envoy's per-downstream connection limit).

The source is the TCP peer's address: uvicorn's proxy headers are off, so no header moves
it. A peer in GATEWAY_PEERS speaks for many clients and is not capped per source.
Counted on the event loop only (one dict), at a connection's opening and its loss.
"""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class SourceCounts:
    """Connections open per source address, and whether one more is past the cap."""

    def __init__(self, limit: int, trusted: tuple[Network, ...] = ()) -> None:
        """`limit`: connections one address may hold (0: no cap); `trusted`: peers not
        capped (the gateway's)."""
        self.limit = limit
        self.trusted = trusted
        self.open: dict[str, int] = {}

    def opened(self, source: str) -> bool:
        """Count one more connection from `source`: True when it is past the cap (the
        caller refuses it; `closed` is called all the same when it goes).

        1. Counted whatever follows.
        2. No cap, or within it: False.
        3. Past it: True, unless `source` is a trusted peer.
        """
        count = self.open.get(source, 0) + 1  # 1
        self.open[source] = count
        if not 0 < self.limit < count:  # 2
            return False
        try:  # 3
            address = ipaddress.ip_address(source)
        except ValueError:
            return True
        return not any(address in net for net in self.trusted)

    def closed(self, source: str) -> None:
        """One connection from `source` is gone."""
        left = self.open.get(source, 1) - 1
        if left:
            self.open[source] = left
        else:
            self.open.pop(source, None)
