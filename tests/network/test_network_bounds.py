"""Every wait on the network ends once the other end falls silent (``Settings.network_timeout``).

A client in a host of its own reaches the database across a link that is then made to drop
every packet, both ways, with no reset: a cut cable, a silent firewall. A connection outbox
created finds out within about its network timeout, whether the cut caught it waiting for a
reply (only keepalives can tell) or sending (its data go unacknowledged), and connects again
once the link is back. The same client with the bound unset is still waiting long after: what
the bound is for, and proof that the link really drops everything.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests._proxy import Proxy
from tests.network._netns import PYTHON, Host, require_namespaces

NETWORK_TIMEOUT = 3.0
# How long after the cut a bounded client must have given up: the bound, a keepalive probe's
# rounding and the statement's own three seconds, with room for a loaded machine.
GIVEN_UP_WITHIN = 4 * NETWORK_TIMEOUT
REPLY_UNDER_WAY_SECONDS = 0.7
MODES = ("reply", "send")  # cut while waiting for a reply; cut, then sending


@pytest.fixture
def host() -> Iterator[Host]:
    require_namespaces()
    with Host() as made:
        yield made


@pytest.fixture(params=["postgresql", "mariadb"])
def database_url(request: pytest.FixtureRequest) -> str:
    fixture = "postgres_url" if request.param == "postgresql" else "mariadb_url"
    url: str = request.getfixturevalue(fixture)
    return url


def _start(host: Host, url: str, bound: str, mode: str) -> subprocess.Popen[str]:
    client = host.popen(
        [PYTHON, "-m", "tests.network.bounded_client", url, bound, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert client.stdout is not None
    assert "ready" == client.stdout.readline().strip()
    return client


def _tell(client: subprocess.Popen[str], line: str) -> None:
    assert client.stdin is not None
    client.stdin.write(line + "\n")
    client.stdin.flush()


def _report(client: subprocess.Popen[str]) -> dict[str, Any]:
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line, f"the client ended without a word (exit {client.wait()})"
    report: dict[str, Any] = json.loads(line)
    return report


def test_a_cut_link_ends_every_wait_within_the_network_timeout_and_the_client_connects_again(
    host: Host, database_url: str
) -> None:
    url = make_url(database_url)
    assert url.host is not None
    assert url.port is not None
    with Proxy(url.host, url.port, listen_host=host.address) as proxy:
        across = url.set(host=host.address, port=proxy.port).render_as_string(False)
        bounded = {mode: _start(host, across, str(NETWORK_TIMEOUT), mode) for mode in MODES}
        unbounded = {mode: _start(host, across, "none", mode) for mode in MODES}
        clients = [*bounded.values(), *unbounded.values()]
        try:
            for client in (bounded["reply"], unbounded["reply"]):
                _tell(client, "go")
            time.sleep(REPLY_UNDER_WAY_SECONDS)  # the statements run on the server
            host.black_hole()
            cut_at = time.monotonic()
            for client in (bounded["send"], unbounded["send"]):
                _tell(client, "go")
            reports = {mode: _report(client) for mode, client in bounded.items()}
            waited = time.monotonic() - cut_at
            for mode, report in reports.items():
                assert report["error"] is not None, (mode, report)
                assert report["lost"], (mode, report)
                assert report["seconds"] < GIVEN_UP_WITHIN, (mode, report)
            # The unbounded clients, cut the same way, still wait well past the bound.
            time.sleep(max(0.0, GIVEN_UP_WITHIN - waited))
            assert [None, None] == [client.poll() for client in unbounded.values()]
            host.heal()
            for client in bounded.values():
                _tell(client, "healed")
                assert client.stdout is not None
                assert "recovered" == client.stdout.readline().strip()
                assert 0 == client.wait(timeout=10)
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                client.wait()
