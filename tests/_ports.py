"""Ports for the servers the tests start: outside the range the kernel draws local ports from."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack

# Below Linux's ephemeral range (32768-60999 by default): a port the kernel hands out for
# ``bind(0)`` can be taken, before the server listens on it, by an outgoing connection (a
# worker's own connections to the database, say), which draws its local port from that range.
LISTEN_PORTS = range(20_000, 32_000)


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports that nothing listens on, outside the
    ephemeral range."""
    for _ in range(100):
        first = random.choice(LISTEN_PORTS)
        try:
            with ExitStack() as stack:
                for port in range(first, first + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {count} free consecutive ports in {LISTEN_PORTS}")
