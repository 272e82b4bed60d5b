"""PostgreSQL connections: the idle-transaction guard, directly or behind a pooler, and UTC."""

from __future__ import annotations

import functools
import os
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.dialects.postgresql import dialect as postgresql_dialect
from sqlalchemy.engine import Dialect as SADialect

from outbox._core import log as _log
from outbox._db.dialects.network import KEEPALIVE_PROBES, NetworkBounds

log = _log.get_logger(__name__)


def behind_pooler(engine: Engine) -> bool:
    """True once a connection of the engine was found to go through a connection pooler
    (PgBouncer, ...), where a server session is not the client's: LISTEN hears nothing there.

    Known after the engine's first connection; only for the engines outbox creates.
    """
    timeout: IdleTimeout | None = getattr(engine, "_outbox_idle_timeout", None)
    return timeout is not None and timeout.pooled


# libpq's drivers, which take the ``options`` startup parameter (``-c name=value``).
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2"})
# What PgBouncer answers to a startup parameter it does not support (``options`` before 1.20,
# a setting inside ``options`` it does not track since).
_REFUSED_STARTUP_PARAMETER = "unsupported startup parameter"
_SESSION_CHECK = (
    "SELECT pg_backend_pid(), setting::int FROM pg_settings"
    " WHERE name = 'idle_in_transaction_session_timeout'"
)


# Whether a connection's transactions set the timeout themselves (in its record's info).
_SET_LOCAL_KEY = "outbox_idle_timeout_set_local"


class IdleTimeout:
    """``idle_in_transaction_session_timeout`` on every transaction of a PostgreSQL engine.

    Directly connected, it is a startup parameter (``options=-c ...``): set once per
    connection, nothing per transaction. A transaction-mode pooler hands each transaction to
    whichever server session is free, which a startup parameter or a session ``SET`` does not
    follow (PgBouncer refuses the parameter, or with ``ignore_startup_parameters`` drops it).
    A connection refused for it is made again without it, and each new connection is checked
    once, in one round trip: is its server session the one it was told of at connect (a pooler
    reports a process id of its own), and did the timeout take? Where it did not, each
    transaction begins with ``SET LOCAL`` (one more round trip). Behind a pooler, psycopg's
    automatic server-side prepared statements are turned off (the next transaction's session
    would not know them: "prepared statement ... does not exist" or "already exists").

    A timeout the server enforces of its own (``ALTER ROLE ... SET``) is not relied on: a
    pooler's older server sessions may predate it, and one session cannot vouch for the rest.
    """

    def __init__(self, engine: Engine, seconds: float) -> None:
        self.engine = engine
        self.milliseconds = int(seconds * 1000)
        self.startup_option = engine.dialect.driver in _LIBPQ_DRIVERS
        self.refused = False
        """A pooler refused the startup parameter: connect without it from now on."""
        self.pooled = False
        """A connection went through a pooler (see :func:`behind_pooler`)."""

    def install(self) -> None:
        """Listen to the engine's connects and begins."""
        if self.startup_option:
            event.listen(self.engine, "do_connect", self._connect)
        event.listen(self.engine, "connect", self._check)
        event.listen(self.engine, "begin", self._begin)
        self.engine._outbox_idle_timeout = self  # type: ignore[attr-defined]

    def _connect(self, dialect: SADialect, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        if self.refused:
            return None  # SQLAlchemy connects with the URL's own options, if any
        own = cparams.get("options", "")
        own = own[0] if isinstance(own, tuple) else own  # ?options= given twice
        ours = f"{own} -c idle_in_transaction_session_timeout={self.milliseconds}".strip()
        try:
            return dialect.connect(*cargs, **{**cparams, "options": ours})
        except dialect.loaded_dbapi.OperationalError as error:
            if _REFUSED_STARTUP_PARAMETER not in str(error):
                raise
            self.refused = True
            return None

    def _check(self, dbapi_connection: Any, record: Any) -> None:
        # In autocommit: no BEGIN and ROLLBACK around it.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(_SESSION_CHECK)
            server_pid, in_force = cursor.fetchone()
            cursor.close()
        finally:
            dbapi_connection.autocommit = autocommit
        told_pid = getattr(getattr(dbapi_connection, "info", None), "backend_pid", None)
        pooled = self.refused or (told_pid is not None and told_pid != server_pid)
        pooled = pooled or (self.startup_option and in_force != self.milliseconds)
        record.info[_SET_LOCAL_KEY] = pooled or in_force != self.milliseconds
        if not pooled:
            return
        if hasattr(dbapi_connection, "prepare_threshold"):
            dbapi_connection.prepare_threshold = None
        if not self.pooled:
            self.pooled = True
            log.info(
                _log.POOLER_DETECTED,
                idle_transaction_timeout="set per transaction",
                prepared_statements="off",
            )

    def _begin(self, connection: Any) -> None:
        if not connection.connection.info.get(_SET_LOCAL_KEY):
            return
        if getattr(connection.connection.driver_connection, "autocommit", False):
            return  # SET LOCAL outside a transaction block only draws a warning
        connection.exec_driver_sql(
            f"SET LOCAL idle_in_transaction_session_timeout = {self.milliseconds}"
        )


# Zones that are UTC under another name, with the abbreviation UTC (the GMT names print GMT).
_UTC_ALIASES = frozenset(
    {"Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu"}
)


def name_utc_plainly(dbapi_connection: Any, connection_record: Any) -> None:
    if dbapi_connection.info.parameter_status("TimeZone") in _UTC_ALIASES:
        dbapi_connection.execute("SET TimeZone TO 'UTC'")
        # Committed: SQLAlchemy rolls back a connection it takes from the pool, and a rolled
        # back SET is undone.
        dbapi_connection.commit()


def libpq_bounds(bounds: NetworkBounds) -> dict[str, int]:
    """``bounds`` as libpq's connection parameters (``connect_timeout`` in whole seconds)."""
    return {
        "keepalives": 1,
        "keepalives_idle": bounds.keepalive_idle,
        "keepalives_interval": bounds.keepalive_interval,
        "keepalives_count": KEEPALIVE_PROBES,
        "tcp_user_timeout": bounds.user_timeout_ms,
        "connect_timeout": bounds.connect_timeout,
    }


# libpq takes tcp_user_timeout from version 12.
_TCP_USER_TIMEOUT_SINCE = 120000


def _libpq_version(dialect: SADialect) -> int:
    """The version of the libpq the driver runs on (``150004``: 15.4)."""
    dbapi = dialect.loaded_dbapi
    if dialect.driver == "psycopg":
        return int(dbapi.pq.version())
    return int(dbapi.extensions.libpq_version())


def bound_network_waits(engine: Engine, seconds: float) -> None:
    """Connect with no wait on the network outlasting about ``seconds`` once the server stops
    answering (:mod:`outbox._db.dialects.network`), as libpq's parameters: but for what the URL
    (or ``PGCONNECT_TIMEOUT``) sets itself."""
    if engine.dialect.driver not in _LIBPQ_DRIVERS:
        return
    bounds = libpq_bounds(NetworkBounds(seconds))
    if os.environ.get("PGCONNECT_TIMEOUT"):
        del bounds["connect_timeout"]
    if _libpq_version(engine.dialect) < _TCP_USER_TIMEOUT_SINCE:
        # An older libpq refuses the parameter, and so every connection: keepalives alone.
        del bounds["tcp_user_timeout"]

    def add_bounds(dialect: SADialect, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        for name, value in bounds.items():
            cparams.setdefault(name, value)

    event.listen(engine, "do_connect", add_bounds)


def configure(
    engine: Engine, idle_transaction_timeout: float | None, network_timeout: float | None = None
) -> None:
    """Through psycopg, a session whose time zone is UTC under another name (``Etc/UTC``, the
    default of many server images) is switched to the name ``UTC``. That changes no value and
    no time arithmetic, only how fast psycopg reads ``timestamptz`` columns: for ``UTC`` it
    attaches Python's own UTC, for any other name it converts each value through zoneinfo, a
    visible part of reading a claimed row.

    ``idle_transaction_timeout`` (float seconds): the server ends a transaction left idle this
    long, so that a frozen worker cannot hold row locks forever. See :class:`IdleTimeout` for
    how it is set, directly and behind a connection pooler.

    ``network_timeout`` (float seconds): see :func:`bound_network_waits`.
    """
    if network_timeout is not None:
        # Before the idle timeout's listener, which connects itself with the parameters as
        # they are then.
        bound_network_waits(engine, network_timeout)
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "connect", name_utc_plainly)
    if idle_transaction_timeout is not None:
        IdleTimeout(engine, idle_transaction_timeout).install()


def reading_connection(engine: Engine) -> Connection:
    """A connection for one statement that only reads: in autocommit, which psycopg switches
    on and off without a word to the server: no ``BEGIN`` and ``ROLLBACK`` around the
    statement (nor the idle timeout's ``SET LOCAL``), which cost the read more round trips than
    its statement (one statement reads one snapshot either way)."""
    return engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def read_committed(engine: Engine) -> Engine:
    """``engine`` itself: PostgreSQL's default level is READ COMMITTED."""
    return engine


@functools.cache
def sqlalchemy_dialect() -> SADialect:
    """A PostgreSQL dialect object, for compiling with no connection."""
    return postgresql_dialect()  # type: ignore[no-untyped-call]
