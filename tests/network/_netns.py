"""A host of its own on this machine: a network namespace behind a router namespace of its own,
whose links can be made to drop every packet, in transit, without a reset.

    root namespace (servers, proxies) --uplink-- router --link-- host

The database servers listen on loopback in the root namespace; a :class:`tests._proxy.Proxy`
on the root side of the uplink forwards to them, so that a process in the host reaches a server
only through the router. :meth:`Host.black_hole` puts a ``tbf`` queue too small for any packet
on both of the router's interfaces (this kernel has no ``netem``): every packet either way is
dropped by the router, as a cut cable or a silent firewall drops it. Dropped at a sender
instead, a packet is a local failure its kernel knows of: it retries a keepalive probe lost so
for ever, and no timeout would show.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# A token bucket smaller than any packet: nothing ever leaves the queue, so all is dropped.
BLACK_HOLE = ["tbf", "rate", "8kbit", "burst", "16", "limit", "16"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def require_namespaces() -> None:
    """Skip (fail when ``CI=true``) where namespaces cannot be made: not root, no ``ip``."""
    reason = None
    if shutil.which("ip") is None or shutil.which("tc") is None:
        reason = "iproute2 (ip, tc) is not installed"
    elif os.geteuid() != 0:
        reason = "network namespaces need root"
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: network tests must not skip)", pytrace=False)
    pytest.skip(reason)


class Host:
    """A host namespace behind a router namespace of its own: ``address`` is the root side of
    the uplink (where proxies listen), ``own_address`` the host's."""

    def __init__(self) -> None:
        # Random, so that two runs on one machine neither share names nor addresses.
        tag = secrets.token_hex(3)
        self.name, self.router = f"obx{tag}h", f"obx{tag}r"
        self.uplink = (f"obx{tag}u", f"obx{tag}v")  # root side, router side
        self.link = (f"obx{tag}l", f"obx{tag}m")  # router side, host side
        second, third = secrets.randbelow(50) + 200, secrets.randbelow(125) * 2
        prefix = f"10.{second}.{third}"
        self.address, self.router_up = f"{prefix}.1", f"{prefix}.2"
        prefix = f"10.{second}.{third + 1}"
        self.router_down, self.own_address = f"{prefix}.1", f"{prefix}.2"
        self.host_subnet = f"{prefix}.0/30"
        self.cut = False

    def __enter__(self) -> Host:
        try:
            for namespace in (self.router, self.name):
                _ip("netns", "add", namespace)
                _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("link", "add", self.uplink[0], "type", "veth", "peer", "name", self.uplink[1])
            _ip("link", "set", self.uplink[1], "netns", self.router)
            _ip("addr", "add", f"{self.address}/30", "dev", self.uplink[0])
            _ip("link", "set", self.uplink[0], "up")
            _ip("-n", self.router, "addr", "add", f"{self.router_up}/30", "dev", self.uplink[1])
            _ip("-n", self.router, "link", "set", self.uplink[1], "up")
            _ip("-n", self.router, "link", "add", self.link[0], "type", "veth", "peer", "name",
                self.link[1])  # fmt: skip
            _ip("-n", self.router, "link", "set", self.link[1], "netns", self.name)
            _ip("-n", self.router, "addr", "add", f"{self.router_down}/30", "dev", self.link[0])
            _ip("-n", self.router, "link", "set", self.link[0], "up")
            _ip("-n", self.name, "addr", "add", f"{self.own_address}/30", "dev", self.link[1])
            _ip("-n", self.name, "link", "set", self.link[1], "up")
            _ip("-n", self.name, "route", "add", "default", "via", self.router_down)
            _ip("route", "add", self.host_subnet, "via", self.router_up)
            _in(self.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def black_hole(self) -> None:
        """Drop every packet between the host and the rest in the router, both ways, without a
        word to either end."""
        _in(self.router, "tc", "qdisc", "add", "dev", self.uplink[1], "root", *BLACK_HOLE)
        _in(self.router, "tc", "qdisc", "add", "dev", self.link[0], "root", *BLACK_HOLE)
        self.cut = True

    def slow(self, queue: list[str]) -> None:
        """Send every packet between the host and the rest through ``queue`` (a ``tc`` qdisc,
        such as a slow ``tbf``), both ways, in the router: late where it waits, lost where it
        overflows."""
        _in(self.router, "tc", "qdisc", "add", "dev", self.uplink[1], "root", *queue)
        _in(self.router, "tc", "qdisc", "add", "dev", self.link[0], "root", *queue)
        self.cut = True

    def dropped(self) -> int:
        """Packets the router's queues have dropped since :meth:`slow` or :meth:`black_hole`."""
        total = 0
        for device in (self.uplink[1], self.link[0]):
            shown = subprocess.run(
                ["ip", "netns", "exec", self.router, "tc", "-s", "qdisc", "show", "dev", device],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", shown))
        return total

    def heal(self) -> None:
        """Let packets through again, as they came."""
        _in(self.router, "tc", "qdisc", "del", "dev", self.uplink[1], "root")
        _in(self.router, "tc", "qdisc", "del", "dev", self.link[0], "root")
        self.cut = False

    def popen(self, args: list[str], **kwargs: object) -> subprocess.Popen[str]:
        """Start ``args`` inside the host, from the repository's root."""
        root = Path(__file__).resolve().parents[2]
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            ["ip", "netns", "exec", self.name, *args],
            cwd=root,
            text=True,
            **kwargs,
        )

    def close(self) -> None:
        """Remove both namespaces (the links' ends in them go, and so the other ends, and the
        root namespace's route with its link)."""
        for namespace in (self.name, self.router):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.uplink[0]], capture_output=True)


def _in(namespace: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, *args], check=True, capture_output=True)


PYTHON = sys.executable
