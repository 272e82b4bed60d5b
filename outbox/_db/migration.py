"""The statements ``outbox migrate`` runs around the migrations: a bound on every lock wait,
one run at a time per database, who holds a lock it waited for, DDL that can run again, and
the rows a downgrade would drop."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, event, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from outbox import schema
from outbox._db.dialects import MYSQL, POSTGRESQL, name_of

# The key of the advisory lock that serializes ``outbox migrate`` on PostgreSQL: advisory
# locks belong to one database, so runs on other databases of the server never wait for it.
_PG_RUN_LOCK_KEY = 0x6F7574626F78  # "outbox" in ASCII
_PG_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout, advisory locks included
_MYSQL_LOCK_WAIT_TIMEOUT = 1205  # metadata locks (lock_wait_timeout) and row locks alike


@dataclass(frozen=True)
class LockHolder:
    """A session that holds, or may hold, a lock a migration waited for."""

    pid: int
    seconds: float | None
    """How long its transaction has been open, in seconds; None when the database does not say."""
    query: str
    """The start of its current (PostgreSQL: or last) statement; empty when idle."""


@contextmanager
def bounded_lock_waits(conn: Connection, seconds: float) -> Iterator[None]:
    """Every lock the statements of ``conn``'s transaction wait for, they wait for at most
    ``seconds`` (float seconds), then fail (:func:`is_lock_timeout`); no limit on how long a
    statement runs once it has its locks.

    PostgreSQL: ``SET LOCAL``, which ends with the transaction (and so works behind a pooler in
    transaction mode). MariaDB: the session's metadata-lock and row-lock waits, whole seconds
    (at least 1), set back as they were afterwards. SQLite: its busy timeout already bounds the
    wait for the write lock, the only lock it has.
    """
    dialect = name_of(conn.dialect)
    if dialect == POSTGRESQL:
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{max(1, round(seconds * 1000))}ms'")
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        yield
        return
    if dialect != MYSQL:
        yield
        return
    saved = conn.exec_driver_sql(
        "SELECT @@SESSION.lock_wait_timeout, @@SESSION.innodb_lock_wait_timeout"
    ).one()
    whole = max(1, math.ceil(seconds))
    conn.exec_driver_sql(
        f"SET SESSION lock_wait_timeout = {whole}, innodb_lock_wait_timeout = {whole}"
    )
    try:
        yield
    finally:
        conn.exec_driver_sql(
            f"SET SESSION lock_wait_timeout = {int(saved[0])}, "
            f"innodb_lock_wait_timeout = {int(saved[1])}"
        )


def is_lock_timeout(error: BaseException) -> bool:
    """True when a statement gave up waiting for a lock (:func:`bounded_lock_waits`)."""
    orig = getattr(error, "orig", None)
    args: tuple[Any, ...] = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] == _MYSQL_LOCK_WAIT_TIMEOUT
    return getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE


_OUTBOX_TABLE = re.compile(r"\b(outbox_\w+)\b")


def table_waited_for(error: DBAPIError) -> str | None:
    """The outbox table named by the statement that gave up waiting for a lock."""
    found = _OUTBOX_TABLE.search(str(error.statement or ""))
    return found.group(1) if found else None


def lock_holders(engine: Engine, table: str | None) -> list[LockHolder]:
    """Who holds a lock on ``table``, longest open first, as far as the database says.

    PostgreSQL: the sessions holding a lock on the table (``pg_locks``). MariaDB: the sessions
    holding its metadata lock where the ``METADATA_LOCK_INFO`` plugin is installed; else
    the sessions with an open transaction (``INNODB_TRX``), which are the candidates.
    """
    dialect = name_of(engine.dialect)
    with engine.connect() as conn:
        if dialect == POSTGRESQL and table is not None:
            rows = conn.exec_driver_sql(
                "SELECT DISTINCT a.pid, EXTRACT(EPOCH FROM now() - a.xact_start),"
                " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60), a.xact_start"
                " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE l.relation = to_regclass(%(table)s) AND l.granted"
                " AND l.pid <> pg_backend_pid() ORDER BY a.xact_start",
                {"table": table},
            ).all()
        elif dialect == MYSQL:
            rows = _mysql_lock_holders(conn, table)
        else:
            rows = []
    return [
        LockHolder(int(r[0]), None if r[1] is None else float(r[1]), str(r[2] or "")) for r in rows
    ]


def _mysql_lock_holders(conn: Connection, table: str | None) -> list[Any]:
    plugin = conn.exec_driver_sql(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'information_schema'"
        " AND TABLE_NAME = 'METADATA_LOCK_INFO'"
    ).scalar_one()
    if plugin and table is not None:
        return list(
            conn.exec_driver_sql(
                "SELECT DISTINCT p.ID, p.TIME, LEFT(p.INFO, 60) FROM"
                " information_schema.METADATA_LOCK_INFO m JOIN information_schema.PROCESSLIST p"
                " ON p.ID = m.THREAD_ID WHERE m.TABLE_SCHEMA = DATABASE()"
                " AND m.TABLE_NAME = %(table)s AND p.ID <> CONNECTION_ID() ORDER BY p.TIME DESC",
                {"table": table},
            ).all()
        )
    return list(
        conn.exec_driver_sql(
            "SELECT p.ID, TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1e6,"
            " LEFT(COALESCE(t.trx_query, p.INFO), 60) FROM information_schema.INNODB_TRX t"
            " JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id"
            " WHERE p.ID <> CONNECTION_ID() ORDER BY t.trx_started"
        ).all()
    )


# --- one run at a time -----------------------------------------------------------------------


class RunLockTimeoutError(Exception):
    """Another run held the lock of ``outbox migrate`` longer than the wait allowed."""

    def __init__(self, holder: int | None) -> None:
        self.holder = holder
        super().__init__(holder)


@contextmanager
def run_lock(engine: Engine, wait: float) -> Iterator[Connection | None]:
    """Hold the database's lock of ``outbox migrate`` while the block runs, waiting up to
    ``wait`` seconds for another run to release it (then :class:`RunLockTimeoutError`).

    PostgreSQL: a transaction-scoped advisory lock in a transaction of its own, held open on a
    dedicated connection (a pooler in transaction mode keeps one server connection for it).
    MariaDB: a named lock (``GET_LOCK``), named after the database, as its names are the
    server's. Both yield None: each revision runs on a connection of its own.

    SQLite: the database's write lock is the run's lock. It yields the connection every
    revision must run on, in one transaction that took the write lock before it read anything
    (``BEGIN IMMEDIATE``, waiting up to the busy timeout), committed at the end.
    """
    dialect = name_of(engine.dialect)
    if dialect not in (POSTGRESQL, MYSQL):
        with engine.connect() as conn, conn.begin():
            if not conn.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
                # An engine outbox did not set up: the driver begins no transaction by itself.
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            yield conn
        return
    with engine.connect() as conn:
        if dialect == POSTGRESQL:
            _pg_run_lock(conn, wait)
            try:
                yield None
            finally:
                conn.rollback()
            return
        name = _mysql_run_lock_name(conn)
        got = conn.exec_driver_sql(
            "SELECT GET_LOCK(%(name)s, %(wait)s)", {"name": name, "wait": wait}
        ).scalar()
        if got != 1:
            holder = conn.exec_driver_sql("SELECT IS_USED_LOCK(%(n)s)", {"n": name}).scalar()
            raise RunLockTimeoutError(None if holder is None else int(holder))
        try:
            yield None
        finally:
            conn.exec_driver_sql("SELECT RELEASE_LOCK(%(name)s)", {"name": name})
            conn.commit()


def _pg_run_lock(conn: Connection, wait: float) -> None:
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{max(1, round(wait * 1000))}ms'")
    try:
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _PG_RUN_LOCK_KEY})
    except DBAPIError as error:
        if not is_lock_timeout(error):
            raise
        conn.rollback()
        holder = conn.exec_driver_sql(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND ((classid::bigint << 32) | objid::bigint) = %(key)s LIMIT 1",
            {"key": _PG_RUN_LOCK_KEY},
        ).scalar()
        conn.rollback()
        raise RunLockTimeoutError(None if holder is None else int(holder)) from error


def _mysql_run_lock_name(conn: Connection) -> str:
    database = str(conn.exec_driver_sql("SELECT DATABASE()").scalar() or "")
    name = f"outbox_migrate.{database}"
    # A lock's name has at most 64 characters.
    return name if len(name) <= 64 else hashlib.sha256(name.encode()).hexdigest()


# --- DDL that can run again --------------------------------------------------------------------

# MariaDB commits each DDL statement by itself: a revision stopped half-way (a lock wait given
# up) has done some of its statements, and running it again must skip those. MariaDB has an
# IF [NOT] EXISTS form of each statement the migrations issue; MODIFY is the same when run twice.
_RERUNNABLE = (
    (re.compile(r"^(\s*CREATE TABLE) (?!IF NOT EXISTS)", re.I), r"\1 IF NOT EXISTS "),
    (re.compile(r"^(\s*DROP TABLE) (?!IF EXISTS)", re.I), r"\1 IF EXISTS "),
    (re.compile(r"^(\s*CREATE (?:UNIQUE )?INDEX) (?!IF NOT EXISTS)", re.I), r"\1 IF NOT EXISTS "),
    (re.compile(r"^(\s*DROP INDEX) (?!IF EXISTS)", re.I), r"\1 IF EXISTS "),
    (re.compile(r"\b(ADD COLUMN) (?!IF NOT EXISTS)", re.I), r"\1 IF NOT EXISTS "),
    (re.compile(r"\b(DROP COLUMN) (?!IF EXISTS)", re.I), r"\1 IF EXISTS "),
)  # fmt: skip


def rerunnable_ddl(conn: Connection) -> None:
    """On MariaDB, issue the migrations' DDL on ``conn`` in its IF [NOT] EXISTS forms, so that
    a revision stopped half-way can run again whole. Elsewhere DDL is transactional (PostgreSQL,
    SQLite): a revision stopped half-way has done nothing."""
    if not getattr(conn.dialect, "is_mariadb", False):
        return

    @event.listens_for(conn, "before_cursor_execute", retval=True)
    def _rewrite(
        conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> tuple[str, Any]:
        if re.match(r"\s*(CREATE|DROP|ALTER)\b", statement, re.I):
            for pattern, replacement in _RERUNNABLE:
                statement = pattern.sub(replacement, statement)
        return statement, parameters


# --- what a downgrade drops -------------------------------------------------------------------


@dataclass(frozen=True)
class Loss:
    """Rows (or values) a downgrade drops: how many, of what, where."""

    where: str
    """The table, or ``table.column``."""
    count: int
    noun: str
    """What one of them is, in the plural (``held ordering keys``)."""


def _count(conn: Connection, table: Table, *where: ColumnElement[bool]) -> int:
    return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def downgrade_losses(conn: Connection, revision: str) -> list[Loss]:
    """What undoing ``revision`` would drop, as the database holds it now (none counted 0)."""
    counted = _LOSSES.get(revision, ())
    losses = [Loss(where, count(conn), noun) for where, noun, count in counted]
    return [loss for loss in losses if loss.count]


_jobs, _handlers, _limits = schema.jobs, schema.handlers, schema.rate_limits
_LOSSES: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "0006": (
        ("outbox_attempts", "recorded attempts", lambda c: _count(c, schema.attempts)),
        ("outbox_operations", "recorded operations", lambda c: _count(c, schema.operations)),
        (
            "outbox_archive",
            "replayed events' records",
            lambda c: _count(
                c, schema.archive, schema.archive.c.status == schema.ArchiveStatus.REPLAYED
            ),
        ),
    ),
    "0004": (
        (
            "outbox_rate_limits.starts",
            "rate-limit windows",
            lambda c: _count(c, _limits, _limits.c.starts.is_not(None)),
        ),
    ),
    "0003": (
        (
            "outbox_handlers",
            "pauses",
            lambda c: _count(c, _handlers, _handlers.c.paused_at.is_not(None)),
        ),
        (
            "outbox_handlers",
            "open or counting breakers",
            lambda c: _count(c, _handlers, (_handlers.c.failures > 0) | (_handlers.c.trips > 0)),
        ),
        ("outbox_held_keys", "held ordering keys", lambda c: _count(c, schema.held_keys)),
        ("outbox_rate_limits", "rate-limit states", lambda c: _count(c, _limits)),
        (
            "outbox_jobs.deferrals",
            "jobs' deferral counts",
            lambda c: _count(c, _jobs, _jobs.c.deferrals > 0),
        ),
    ),
    "0001": (
        ("outbox_jobs", "jobs", lambda c: _count(c, _jobs)),
        ("outbox_archive", "archived events", lambda c: _count(c, schema.archive)),
        ("outbox_workers", "workers", lambda c: _count(c, schema.workers)),
    ),
}
