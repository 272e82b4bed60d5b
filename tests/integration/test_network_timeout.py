"""``Settings.network_timeout`` on the connections of the engines outbox creates: what the
driver is told, what the URL's own settings keep, and engines outbox does not own.

That the bounds end a wait on a link that drops everything is shown across a network, in
tests/network/test_network_bounds.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError

from outbox import Outbox, Settings
from tests import _support

LIBPQ = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")


def _libpq(app: Outbox) -> dict[str, Any]:
    with app.engine.connect() as conn:
        parameters = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    app.engine.dispose()
    return {name: parameters.get(name) for name in (*LIBPQ, "tcp_user_timeout", "connect_timeout")}


def test_postgresql_connections_get_keepalives_and_a_user_timeout_from_the_setting(
    postgres_url: str,
) -> None:
    assert {
        "keepalives": "1",
        "keepalives_idle": "4",
        "keepalives_interval": "2",
        "keepalives_count": "3",
        "tcp_user_timeout": "12000",
        "connect_timeout": "12",
    } == _libpq(Outbox(postgres_url, settings=Settings(network_timeout=12)))


def test_what_the_url_sets_itself_wins(postgres_url: str) -> None:
    url = f"{postgres_url}?keepalives_idle=7&tcp_user_timeout=0"
    found = _libpq(Outbox(url, settings=Settings(network_timeout=12)))
    assert ("7", "0", "2") == (
        found["keepalives_idle"],
        found["tcp_user_timeout"],
        found["keepalives_interval"],
    )


def test_none_leaves_the_driver_s_defaults(postgres_url: str) -> None:
    found = _libpq(Outbox(postgres_url, settings=Settings(network_timeout=None)))
    assert (None, None) == (found["keepalives_idle"], found["tcp_user_timeout"])


def test_an_engine_the_application_made_is_left_as_it_is(postgres_url: str) -> None:
    engine = create_engine(postgres_url)
    app = Outbox(engine=engine, settings=Settings(network_timeout=12))
    found = _libpq(app)
    assert (None, None) == (found["keepalives_idle"], found["tcp_user_timeout"])


@pytest.mark.parametrize("seconds", [12.0, 30.0])
def test_mariadb_sockets_get_keepalives_and_a_user_timeout(
    mariadb_url: str, seconds: float
) -> None:
    app = Outbox(mariadb_url, settings=Settings(network_timeout=seconds))
    with app.engine.connect() as conn:
        sock = conn.connection.driver_connection._sock  # type: ignore[union-attr]
        found = [
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            *(
                sock.getsockopt(socket.IPPROTO_TCP, option)
                for option in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)
            ),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        ]
    app.engine.dispose()
    assert [1, round(seconds / 3), round(seconds / 6), 3, int(seconds * 1000)] == found


@pytest.fixture
def silent_server() -> Iterator[int]:
    with _support.silent_server() as port:
        yield port


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_a_server_that_never_answers_is_given_up_on_within_the_timeout(
    silent_server: int, driver: str
) -> None:
    """The connect itself is bounded, greeting and login included: PyMySQL's
    ``connect_timeout`` covers only the TCP connect, its handshake waits on ``read_timeout``."""
    app = Outbox(
        f"{driver}://user@127.0.0.1:{silent_server}/db", settings=Settings(network_timeout=2)
    )
    started = time.monotonic()
    with pytest.raises(OperationalError):
        app.engine.connect()
    assert time.monotonic() - started < 2 * 3
