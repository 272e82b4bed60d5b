"""MariaDB and MySQL connections: READ COMMITTED, the idle-transaction guard, bounded waits on
the network, the oldest server outbox runs on."""

from __future__ import annotations

import functools
import math
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.dialects.mysql import dialect as mysql_dialect
from sqlalchemy.engine import Dialect as SADialect

from outbox._db.dialects.network import NetworkBounds, bound_socket
from outbox.exceptions import UnsupportedDatabaseError


def read_committed(engine: Engine) -> Engine:
    """``engine`` for outbox's own transactions: on MariaDB and MySQL at READ COMMITTED.

    At their default, REPEATABLE READ, a claim's locking read also locks the gaps of the index
    it scans, and the application's INSERTs wait behind it. An application's engine keeps its
    own level: outbox gets a copy sharing its pool (``Engine.execution_options``) that sets the
    level on each connection it checks out, and resets it when the connection goes back. The
    engines outbox creates are READ COMMITTED throughout (no statement per checkout).
    """
    # As given to create_engine(isolation_level=...), or to execution_options(...).
    level = engine.get_execution_options().get("isolation_level")
    level = level or getattr(engine.dialect, "_on_connect_isolation_level", None)
    if level == "READ COMMITTED":
        return engine
    return engine.execution_options(isolation_level="READ COMMITTED")


# The oldest servers outbox runs on: MariaDB has SKIP LOCKED since 10.6, MySQL since 8.0.
MIN_MARIADB_VERSION = (10, 6)
MIN_MYSQL_VERSION = (8, 0)


# The timeouts PyMySQL is given for the connect and the handshake only (see bound_network_waits).
_HANDSHAKE_TIMEOUTS = ("read_timeout", "write_timeout")
_HANDSHAKE_BOUND = "outbox_handshake_bound"


def bound_network_waits(engine: Engine, seconds: float) -> None:
    """Through PyMySQL, connect with no wait on the network outlasting about ``seconds`` once
    the server stops answering (:mod:`outbox._db.dialects.network`). PyMySQL takes no
    keepalive options of its own: the connect, the server's greeting, the login and the
    session's first statements are bounded by its ``connect_timeout``, ``read_timeout`` and
    ``write_timeout``; once connected, the two timeouts are lifted again (they would also end
    a long statement the server is still running: a migration's copy, a prune) and the
    socket's keepalives and ``TCP_USER_TIMEOUT`` take over. A timeout the URL sets itself is
    kept. Other drivers are left as they are (docs/operations.md)."""
    if engine.dialect.driver != "pymysql":
        return
    bounds = NetworkBounds(seconds)

    def bound_handshake(
        dialect: SADialect, record: Any, cargs: Any, cparams: dict[str, Any]
    ) -> None:
        cparams.setdefault("connect_timeout", bounds.connect_timeout)
        ours = [name for name in _HANDSHAKE_TIMEOUTS if name not in cparams]
        for name in ours:
            cparams[name] = seconds
        if record is not None:
            record.info[_HANDSHAKE_BOUND] = ours

    def bound(dbapi_connection: Any, record: Any) -> None:
        for name in record.info.pop(_HANDSHAKE_BOUND, ()):
            setattr(dbapi_connection, f"_{name}", None)  # PyMySQL's own: applied at next use
        sock = getattr(dbapi_connection, "_sock", None)  # PyMySQL's socket, once connected
        if sock is not None:
            bound_socket(sock, bounds)

    event.listen(engine, "do_connect", bound_handshake)
    event.listen(engine, "connect", bound)


def configure(
    engine: Engine, idle_transaction_timeout: float | None, network_timeout: float | None = None
) -> None:
    """Refuse a MariaDB or MySQL server too old for outbox's claims, on every new connection
    (a comparison of the version SQLAlchemy read when it first connected). On MariaDB, the
    server ends a transaction left idle past ``idle_transaction_timeout`` (whole seconds,
    rounded up), as PostgreSQL does; MySQL has no such setting (docs/operations.md).
    ``network_timeout``: see :func:`bound_network_waits`."""
    if network_timeout is not None:
        bound_network_waits(engine, network_timeout)

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dialect = engine.dialect
        mariadb = bool(getattr(dialect, "is_mariadb", False))
        version = tuple(dialect.server_version_info or ())
        needed = MIN_MARIADB_VERSION if mariadb else MIN_MYSQL_VERSION
        if version and version < needed:
            raise UnsupportedDatabaseError(
                f"outbox needs {'MariaDB' if mariadb else 'MySQL'} "
                f"{'.'.join(map(str, needed))} or newer (for SELECT ... FOR UPDATE SKIP LOCKED); "
                f"this server is {'.'.join(map(str, version))}"
            )
        if mariadb and idle_transaction_timeout is not None:
            cursor = dbapi_connection.cursor()
            cursor.execute(
                f"SET SESSION idle_transaction_timeout = {math.ceil(idle_transaction_timeout)}"
            )
            cursor.close()

    event.listen(engine, "connect", on_connect)


def reading_connection(engine: Engine) -> Connection:
    """A connection for one statement that only reads, as it comes: MariaDB's drivers send a
    statement to switch autocommit."""
    return engine.connect()


def behind_pooler(engine: Engine) -> bool:
    """False: outbox detects no pooler in front of MariaDB or MySQL."""
    return False


@functools.cache
def sqlalchemy_dialect() -> SADialect:
    """A MySQL dialect object (MariaDB's too), for compiling with no connection."""
    return mysql_dialect()
