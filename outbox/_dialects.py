"""What differs between PostgreSQL, SQLite and MariaDB/MySQL, and only that.

Everything else in outbox is written once against SQLAlchemy Core; the few places where the
databases disagree (the clock, interval arithmetic, locking claims, insert-or-ignore, JSON
payloads, transient error codes, connection set-up) are decided here.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, case, event, func, literal, literal_column, null
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.mysql import DATETIME as MYSQL_DATETIME
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.expression import FunctionElement, Insert
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import (
    JSON,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    Numeric,
    Text,
    TypeDecorator,
    TypeEngine,
)

from outbox import _log
from outbox.exceptions import UnsupportedDatabaseError

log = _log.get_logger(__name__)

POSTGRESQL = "postgresql"
SQLITE = "sqlite"
MYSQL = "mysql"  # also MariaDB: SQLAlchemy names both "mysql"
SUPPORTED = (POSTGRESQL, SQLITE, MYSQL)

# SQLite stores DateTime as text; SQLAlchemy writes and parses "YYYY-MM-DD HH:MM:SS.ffffff".
# The database clock must produce exactly that shape so that text comparison orders correctly.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"

# How long a SQLite connection waits for the write lock before giving up: generous, because
# every framework transaction is short and takes the lock up front.
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


def name_of(dialect: SADialect) -> str:
    """The outbox name of a SQLAlchemy dialect; refuses the ones outbox does not run on."""
    if dialect.name == "mariadb":
        return MYSQL
    if dialect.name not in SUPPORTED:
        raise UnsupportedDatabaseError(
            f"outbox runs on PostgreSQL, SQLite and MariaDB/MySQL, not on {dialect.name!r}"
        )
    return dialect.name


@dataclass(frozen=True)
class Supports:
    """What a database can do. Code outside the SQL layer asks these questions, and never
    compares a database's name: a new database is a new set of answers."""

    one_statement_claim: bool
    """A claim job's claim is one statement: its lease extended as the fence, the rows
    stamped and returned, the batch job inserted, the probe for more rows (``UPDATE ...
    RETURNING`` inside CTEs)."""
    one_statement_completion: bool
    """A group whose events all succeeded is finished in one statement (data-modifying CTEs)."""
    listen_notify: bool
    """``LISTEN``/``NOTIFY``: triggers wake idle workers (``outbox notify``)."""
    concurrent_reindex: bool
    """``REINDEX ... CONCURRENTLY``: bloated indexes rebuilt without blocking writes."""


SUPPORTS = {
    POSTGRESQL: Supports(
        one_statement_claim=True,
        one_statement_completion=True,
        listen_notify=True,
        concurrent_reindex=True,
    ),
    SQLITE: Supports(
        one_statement_claim=False,
        one_statement_completion=False,
        listen_notify=False,
        concurrent_reindex=False,
    ),
    MYSQL: Supports(
        one_statement_claim=False,
        one_statement_completion=False,
        listen_notify=False,
        concurrent_reindex=False,
    ),
}


def supports(name: str) -> Supports:
    """What the database called ``name`` (:func:`name_of`) can do."""
    return SUPPORTS[name]


# --- the database clock -------------------------------------------------------------------


def timestamp() -> TypeEngine[Any]:
    """The type of every point in time outbox stores: ``DateTime(timezone=True)``, to the
    microsecond on every database. MariaDB's and MySQL's plain DATETIME keeps whole seconds,
    which would cut a lease of a few seconds short by up to one: there it is DATETIME(6)."""
    return DateTime(timezone=True).with_variant(MYSQL_DATETIME(fsp=6), "mysql", "mariadb")


class db_now(FunctionElement[Any]):  # noqa: N801 - named like the SQL function it renders
    """The database's current time. Every lease and backoff is computed from it.

    Public as ``outbox.db_now``: the ``created_at`` default of every buffer table, which
    compiles to each database's own clock when the DDL runs, so a migration that writes
    ``server_default=outbox.db_now()`` runs on every supported database.
    """

    type = DateTime(timezone=True)
    inherit_cache = True


class db_now_plus(FunctionElement[Any]):  # noqa: N801
    """The database's current time plus a number of seconds (a float expression)."""

    type = DateTime(timezone=True)
    inherit_cache = True


class age_seconds(FunctionElement[Any]):  # noqa: N801
    """Seconds between a timestamp column and the database's current time."""

    type = Float()
    inherit_cache = True


@compiles(db_now)
def _now_default(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, POSTGRESQL)
def _now_pg(element: db_now, compiler: Any, **kw: Any) -> str:
    # statement_timestamp, not now(): a lease taken late in a transaction must not start early.
    return "statement_timestamp()"


@compiles(db_now, SQLITE)
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return f"({_SQLITE_NOW})"


# MariaDB and MySQL: UTC_TIMESTAMP, not CURRENT_TIMESTAMP, which is the session's local time
# with no zone in a DATETIME: sessions in other time zones (an application's, say) would date
# their events and leases hours apart. In brackets: MySQL takes a function as a column's
# DEFAULT only so.
_MYSQL_NOW = "(UTC_TIMESTAMP(6))"


@compiles(db_now, MYSQL)
def _now_mysql(element: db_now, compiler: Any, **kw: Any) -> str:
    return _MYSQL_NOW


@compiles(db_now_plus, POSTGRESQL)
def _now_plus_pg(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    return f"(statement_timestamp() + make_interval(secs => {compiler.process(seconds, **kw)}))"


@compiles(db_now_plus, SQLITE)
def _now_plus_sqlite(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    offset = f"printf('%+.6f seconds', {compiler.process(seconds, **kw)})"
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {offset}) || '000')"


@compiles(db_now_plus, MYSQL)
def _now_plus_mysql(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    micros = f"CAST(ROUND({compiler.process(seconds, **kw)} * 1000000) AS SIGNED)"
    return f"({_MYSQL_NOW} + INTERVAL {micros} MICROSECOND)"


@compiles(age_seconds, POSTGRESQL)
def _age_pg(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"EXTRACT(EPOCH FROM (statement_timestamp() - {compiler.process(ts, **kw)}))"


@compiles(age_seconds, SQLITE)
def _age_sqlite(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return f"((julianday('now') - julianday({compiler.process(ts, **kw)})) * 86400.0)"


@compiles(age_seconds, MYSQL)
def _age_mysql(element: age_seconds, compiler: Any, **kw: Any) -> str:
    (ts,) = element.clauses
    return (
        f"(TIMESTAMPDIFF(MICROSECOND, {compiler.process(ts, **kw)}, {_MYSQL_NOW})"
        " / 1000000.0)"
    )


# --- statements that differ ---------------------------------------------------------------


def can_update_returning(dialect: str) -> bool:
    """PostgreSQL and SQLite (3.35+) return rows from UPDATE; MariaDB and MySQL do not."""
    return dialect in (POSTGRESQL, SQLITE)


def uses_skip_locked(dialect: str) -> bool:
    """SQLite has no row locks: its claims rely on the write lock taken by BEGIN IMMEDIATE."""
    return dialect != SQLITE


def insert_ignore(dialect: str, table: Any) -> Insert:
    """An INSERT that skips rows violating a unique index instead of failing."""
    # The other dialects' modules are imported on first use: a worker's start-up should not
    # pay for databases it does not run on.
    if dialect == POSTGRESQL:
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == SQLITE:
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(table).on_conflict_do_nothing()
    from sqlalchemy.dialects.mysql import insert as mysql_insert

    return mysql_insert(table).prefix_with("IGNORE")


MAX_DOUBLE = 1.7976931348623157e308
# Marks a SQLite payload archived in the lenient form, whose JSON columns are kept as text.
JSON_AS_TEXT_MARKER = "__outbox_json_columns_as_text__"


def storage_type(type_: TypeEngine[Any], dialect: SADialect) -> TypeEngine[Any]:
    """The type ``type_``'s values are stored as on ``dialect``: its implementation there, with
    every ``TypeDecorator`` unwrapped (a ``PickleType`` stores bytes; an ``Interval`` is a
    DATETIME on SQLite). The archive holds stored values, and replay writes them back as stored,
    past the decorators' conversions: through them, a value would be converted twice."""
    impl = type_.dialect_impl(dialect)
    while isinstance(impl, TypeDecorator):
        impl = impl.load_dialect_impl(dialect).dialect_impl(dialect)
    return impl


@functools.cache
def default_dialect(name: str) -> SADialect:
    """A dialect object of a database, for deciding types where no engine is at hand."""
    if name == POSTGRESQL:
        return postgresql.dialect()  # type: ignore[no-untyped-call]
    if name == SQLITE:
        from sqlalchemy.dialects import sqlite

        return sqlite.dialect()
    from sqlalchemy.dialects import mysql

    return mysql.dialect()


def dialect_named(name: str) -> SADialect | None:
    """A dialect object of the database SQLAlchemy calls ``name`` (``mariadb`` included), for
    compiling DDL with no connection; None for a database outbox does not run on."""
    name = MYSQL if name == "mariadb" else name
    return default_dialect(name) if name in SUPPORTED else None


def row_as_json(dialect: str, row: NamedFromClause, *, lenient: bool = False) -> ColumnElement[Any]:
    """A JSON object of one row's columns, by column name (the archive's ``payload``).

    ``lenient``: for rows the exact form cannot hold (a json value with ``\\u0000`` that jsonb
    refuses, NaN or nesting SQLite's json() refuses): the row as JSON *text* on PostgreSQL
    (a JSON string), JSON columns as strings on SQLite. Nothing is lost; replay parses them.
    """
    if dialect == POSTGRESQL:
        # The whole row (``alias.*``, so that a column named like the alias cannot hide it):
        # no argument limit, where jsonb_build_object stops at 100.
        whole_row: ColumnElement[Any] = literal_column(f"{row.name}.*")
        if lenient:
            return func.to_jsonb(sql_cast(func.row_to_json(whole_row), Text))
        return func.to_jsonb(whole_row)
    pairs = [
        part
        for column in row.c
        for part in (
            literal(column.name),
            _json_value(
                column, storage_type(column.type, default_dialect(dialect)), lenient, dialect
            ),
        )
    ]
    if lenient:
        pairs += [literal(JSON_AS_TEXT_MARKER), literal(1)]
    return func.json_object(*pairs)


def _json_value(column: Any, stored: TypeEngine[Any], lenient: bool, dialect: str) -> Any:
    if dialect == MYSQL:
        return _mysql_json_value(column, stored)
    # JSON columns are stored as text: json() embeds them as JSON, not as a string. Binary
    # values cannot be JSON: they are written as "\\x<hex>", the form PostgreSQL's to_jsonb uses.
    # REAL values: json_object would keep 15 significant digits; 17 round-trip exactly, and
    # infinities (not JSON numbers) become strings.
    # A column declared JSON has numeric affinity in SQLite: a bare number is stored as REAL.
    # ``stored``: what the column holds, past any TypeDecorator (a PickleType holds bytes).
    if isinstance(stored, JSON):
        if lenient:
            return column
        return case((func.typeof(column) == "real", _exact_real(column)), else_=func.json(column))
    if isinstance(stored, LargeBinary):
        return _hex(column)
    if isinstance(stored, Float | Numeric) and not isinstance(stored, Integer):
        return case((column.is_(None), null()), else_=_exact_real(column))
    if lenient and dialect == SQLITE:
        # SQLite stores what it is given, whatever the declared type: bytes in a column of any
        # type would stop json_object. The lenient form holds every value.
        return case((func.typeof(column) == "blob", _hex(column)), else_=column)
    return column


def _mysql_json_value(column: Any, stored: TypeEngine[Any]) -> Any:
    # JSON_OBJECT writes numbers exactly (a DECIMAL's digits, a DOUBLE's shortest form that
    # reads back as the same double, a FLOAT as the driver reads it), and dates and times as
    # text. A JSON column goes through JSON_EXTRACT, so that its document is embedded as JSON
    # rather than as a string wherever the server does not know the column holds JSON. Binary
    # values cannot be JSON: "\\x<hex>", as on the other databases. One form holds every
    # value MariaDB stores (it refuses invalid text and JSON when they are written): the
    # lenient form is the same.
    if isinstance(stored, JSON):
        return func.json_extract(column, "$")
    if _holds_bytes(stored):
        return _hex(column)
    return column


def _holds_bytes(stored: TypeEngine[Any]) -> bool:
    # BLOB, BINARY, VARBINARY and MariaDB's TINY/MEDIUM/LONGBLOB (which are not LargeBinary).
    try:
        return stored.python_type is bytes
    except NotImplementedError:  # a type that does not say
        return False


def _hex(column: Any) -> Any:
    return case((column.is_(None), null()), else_=literal("\\x") + func.hex(column))


def _exact_real(column: Any) -> Any:
    # 17 significant digits round-trip a double; SQLite's printf is off by one unit in the last
    # place at the very largest doubles, which are written out exactly; infinities, not JSON
    # numbers, become strings.
    return case(
        (func.abs(column) > MAX_DOUBLE, func.json_quote(sql_cast(column, Text))),
        (column == MAX_DOUBLE, func.json(literal(repr(MAX_DOUBLE)))),
        (column == -MAX_DOUBLE, func.json(literal(repr(-MAX_DOUBLE)))),
        else_=func.json(func.printf("%!.17g", column)),
    )


# --- transactions and errors --------------------------------------------------------------

# SQLSTATEs of contention that goes away when the transaction is simply run again.
_PG_TRANSIENT = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57014",  # query_canceled (statement or lock timeout)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up / shutting down)
    "08000",
    "08003",
    "08006",
    "08001",
    "08004",  # connection exceptions
}
# Lock wait timeout, deadlock, lock wait with NOWAIT, server shutting down, server gone away,
# connection lost, cannot connect.
_MYSQL_TRANSIENT = {1205, 1213, 3572, 1053, 2006, 2013, 2003}


def _mysql_errno(orig: object) -> int | None:
    """A MariaDB or MySQL driver error's number (its first argument); None for other drivers,
    whose first argument is the message. Asked first: PyMySQL's errors carry a SQLSTATE too,
    but a coarse one (a lock wait timeout's is the general HY000)."""
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_transient(error: BaseException) -> bool:
    """True for contention and dropped connections: run the transaction again, it may pass."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    errno = _mysql_errno(orig)
    if errno is not None:
        return errno in _MYSQL_TRANSIENT
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _PG_TRANSIENT
    if type(orig).__module__.startswith("psycopg") and isinstance(error, OperationalError):
        # psycopg reports a refused or broken connection (a restarting server) with no SQLSTATE.
        return True
    message = str(orig).lower()
    return "database is locked" in message or "database table is locked" in message


_PG_MISSING_TABLE = {"42P01", "3F000"}  # undefined_table, invalid_schema_name
_MYSQL_NO_SUCH_TABLE = 1146


def is_missing_table(error: BaseException) -> bool:
    """True when a statement failed because a table (or its schema) does not exist.

    Never transient: running the transaction again finds the table missing again. Which
    table it was, the caller finds out by looking (``_db.missing_buffer_tables``).
    """
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    errno = _mysql_errno(orig)
    if errno is not None:
        return errno == _MYSQL_NO_SUCH_TABLE
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _PG_MISSING_TABLE
    return str(orig).lower().startswith("no such table")  # sqlite3


# sqlite3 quotes the offending text when it cannot decode a value: never repeat it.
_SQLITE_QUOTED_TEXT = re.compile(r" with text '.*", re.DOTALL)


def error_summary(error: BaseException) -> str:
    """A database error as type, SQLSTATE and primary message, and nothing more.

    Drivers attach the values a statement failed on (PostgreSQL's DETAIL and CONTEXT, the
    statement's parameters, sqlite3's quoted text); those may be event payloads or secrets,
    and never reach a log line or a stored error.
    """
    target = getattr(error, "orig", None) or error
    diag = getattr(target, "diag", None)
    text = str(target).strip()
    primary = getattr(diag, "message_primary", None) or (text.splitlines()[0] if text else "")
    primary = _SQLITE_QUOTED_TEXT.sub("", primary)
    sqlstate = getattr(target, "sqlstate", None)
    state = f" [{sqlstate}]" if sqlstate else ""
    return f"{type(target).__name__}{state}: {primary}" if primary else type(target).__name__


def configure_engine(engine: Engine, *, idle_transaction_timeout: float | None = None) -> None:
    """Set up connections of an engine the way outbox needs them (once per engine).

    SQLite: see :func:`_configure_sqlite`. PostgreSQL through psycopg: a session whose time
    zone is UTC under another name (``Etc/UTC``, the default of many server images) is switched
    to the name ``UTC``. That changes no value and no time arithmetic, only how fast psycopg
    reads ``timestamptz`` columns: for ``UTC`` it attaches Python's own UTC, for any other name
    it converts each value through zoneinfo, a visible part of reading a claimed row.

    ``idle_transaction_timeout`` (PostgreSQL, float seconds): the server ends a transaction
    left idle this long, so that a frozen worker cannot hold row locks forever. See
    :class:`_IdleTimeout` for how it is set, directly and behind a connection pooler.
    """
    if getattr(engine, "_outbox_configured", False):
        return
    if engine.dialect.name == SQLITE:
        _configure_sqlite(engine)
    elif engine.dialect.name == POSTGRESQL:
        if engine.dialect.driver == "psycopg":
            event.listen(engine, "connect", _name_utc_plainly)
        if idle_transaction_timeout is not None:
            _IdleTimeout(engine, idle_transaction_timeout).install()
    elif name_of(engine.dialect) == MYSQL:
        _configure_mysql(engine, idle_transaction_timeout)
    engine._outbox_configured = True  # type: ignore[attr-defined]


def read_committed(engine: Engine) -> Engine:
    """``engine`` for outbox's own transactions: on MariaDB and MySQL at READ COMMITTED.

    At their default, REPEATABLE READ, a claim's locking read also locks the gaps of the index
    it scans, and the application's INSERTs wait behind it. An application's engine keeps its
    own level: outbox gets a copy sharing its pool (``Engine.execution_options``) that sets the
    level on each connection it checks out, and resets it when the connection goes back. The
    engines outbox creates are READ COMMITTED throughout (no statement per checkout).
    """
    if name_of(engine.dialect) != MYSQL:
        return engine
    # As given to create_engine(isolation_level=...), or to execution_options(...).
    level = engine.get_execution_options().get("isolation_level")
    level = level or getattr(engine.dialect, "_on_connect_isolation_level", None)
    if level == "READ COMMITTED":
        return engine
    return engine.execution_options(isolation_level="READ COMMITTED")


# The oldest servers outbox runs on: MariaDB has SKIP LOCKED since 10.6, MySQL since 8.0.
MIN_MARIADB_VERSION = (10, 6)
MIN_MYSQL_VERSION = (8, 0)


def _configure_mysql(engine: Engine, idle_transaction_timeout: float | None) -> None:
    """Refuse a MariaDB or MySQL server too old for outbox's claims, on every new connection
    (a comparison of the version SQLAlchemy read when it first connected). On MariaDB, the
    server ends a transaction left idle past ``idle_transaction_timeout`` (whole seconds,
    rounded up), as PostgreSQL does; MySQL has no such setting (docs/operations.md)."""

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


def behind_pooler(engine: Engine) -> bool:
    """True once a connection of the engine was found to go through a connection pooler
    (PgBouncer, ...), where a server session is not the client's: LISTEN hears nothing there.

    Known after the engine's first connection; only for the engines outbox creates.
    """
    timeout: _IdleTimeout | None = getattr(engine, "_outbox_idle_timeout", None)
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


class _IdleTimeout:
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


def _name_utc_plainly(dbapi_connection: Any, connection_record: Any) -> None:
    if dbapi_connection.info.parameter_status("TimeZone") in _UTC_ALIASES:
        dbapi_connection.execute("SET TimeZone TO 'UTC'")
        # Committed: SQLAlchemy rolls back a connection it takes from the pool, and a rolled
        # back SET is undone.
        dbapi_connection.commit()


def _configure_sqlite(engine: Engine) -> None:
    """WAL (readers do not block the writer), a long busy timeout, and every transaction
    opened with BEGIN IMMEDIATE, so that a claim takes the write lock before it reads instead of
    failing with "database is locked" when it tries to upgrade a read lock. The pysqlite driver's
    own transaction handling is switched off so that SQLAlchemy's BEGIN is the only one.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
