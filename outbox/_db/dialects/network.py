"""Bounds on every wait on the network (``Settings.network_timeout``), alike for each database.

A network that drops packets without a reset (a cut link, a firewall's silent drop, a host
gone) leaves a connection waiting: for the kernel's retransmissions to give up (about 15
minutes on Linux) when it was sending, and for ever when it was waiting for a reply or idle.
TCP keepalives probe a connection that hears nothing, and ``TCP_USER_TIMEOUT`` ends one whose
data or probes go unacknowledged too long: together they end every such wait after about the
same time, whatever the connection was doing.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass

KEEPALIVE_PROBES = 3
"""Probes missed before a connection is ended where the kernel has no ``TCP_USER_TIMEOUT``."""


@dataclass(frozen=True)
class NetworkBounds:
    """The TCP settings that end a connection about ``seconds`` after its peer fell silent."""

    seconds: float

    @property
    def keepalive_idle(self) -> int:
        """Whole seconds a connection hears nothing before the first probe: a third."""
        return max(1, round(self.seconds / 3))

    @property
    def keepalive_interval(self) -> int:
        """Whole seconds between probes: a sixth, so that three fit in the rest."""
        return max(1, round(self.seconds / 6))

    @property
    def user_timeout_ms(self) -> int:
        """``TCP_USER_TIMEOUT``: milliseconds sent data or probes may go unacknowledged."""
        return round(self.seconds * 1000)

    @property
    def connect_timeout(self) -> int:
        """Whole seconds a connect may take (at least 2, libpq's least)."""
        return max(2, math.ceil(self.seconds))


def bound_socket(sock: socket.socket, bounds: NetworkBounds) -> None:
    """Set ``bounds`` on a connected TCP socket (a Unix socket is left as it is); an option
    the platform lacks is skipped."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", bounds.keepalive_idle),
        ("TCP_KEEPINTVL", bounds.keepalive_interval),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", bounds.user_timeout_ms),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
