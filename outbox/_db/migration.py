"""What ``outbox migrate`` asks of the database around the migrations: a bound on every lock
wait, one run at a time per database, who holds a lock it waited for, DDL that can run again
(each database's package says how: its ``migration`` module), and the rows a downgrade would
drop."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    Table,
    column,
    func,
    inspect,
    select,
    table,
    text,
)
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ColumnElement

from outbox import schema
from outbox._db.dialects.errors import is_lock_timeout
from outbox._db.dialects.interface import Database, LockHolder, RunLockTimeoutError
from outbox._db.dialects.registry import database, name_of


def bounded_lock_waits(conn: Connection, seconds: float) -> AbstractContextManager[None]:
    """Every lock the statements of ``conn``'s transaction wait for, they wait for at most
    ``seconds`` (float seconds), then fail (:func:`is_lock_timeout`); no limit on how long a
    statement runs once it has its locks.

    PostgreSQL: ``SET LOCAL``, which ends with the transaction (and so works behind a pooler in
    transaction mode). MariaDB: the session's metadata-lock and row-lock waits, whole seconds
    (at least 1), set back as they were afterwards. SQLite: its busy timeout already bounds the
    wait for the write lock, the only lock it has.
    """
    return _database(conn.dialect).bounded_lock_waits(conn, seconds)


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
    database = _database(engine.dialect)
    with engine.connect() as conn:
        return database.lock_holders(conn, table)


def run_lock(engine: Engine, wait: float) -> AbstractContextManager[Connection | None]:
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
    return _database(engine.dialect).run_lock(engine, wait)


def recorded_revisions(conn: Connection, version_table: str) -> list[str]:
    """The revisions alembic recorded in ``version_table`` (one row, unless the history
    branched); none when the table does not exist (never migrated), as alembic reads it."""
    if not inspect(conn).has_table(version_table):
        return []
    version_num = column("version_num", String)
    found = conn.execute(select(version_num).select_from(table(version_table)))
    return [str(revision) for revision in found.scalars()]


def rerunnable_ddl(conn: Connection) -> None:
    """On MariaDB, issue the migrations' DDL on ``conn`` in its IF [NOT] EXISTS forms, so that
    a revision stopped half-way can run again whole. Elsewhere DDL is transactional (PostgreSQL,
    SQLite): a revision stopped half-way has done nothing."""
    _database(conn.dialect).rerunnable_ddl(conn)


def _database(dialect: SADialect) -> Database:
    return database(name_of(dialect))


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


_COLLATION = re.compile(r"[A-Za-z0-9_]+")


def folded_ingest_keys(conn: Connection, *, delete: bool = False) -> int:
    """On MariaDB, the ingest keys another key of the same handler equals under the table's
    own collation (a case, an accent or a trailing space apart), which a column back in that
    collation cannot hold: counted, or with ``delete`` deleted (the smallest of each is kept).
    Elsewhere none: keys are compared exactly there in every generation."""
    if name_of(conn.dialect) != "mysql":
        return 0
    collation = conn.execute(
        text(
            "SELECT TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_ingest_keys'"
        )
    ).scalar()
    if collation is None or not _COLLATION.fullmatch(collation):
        return 0
    joined = (
        "outbox_ingest_keys k JOIN outbox_ingest_keys o ON o.handler = k.handler "
        f"AND o.`key` < k.`key` AND o.`key` COLLATE {collation} = k.`key` COLLATE {collation}"
    )
    if delete:
        return int(conn.execute(text(f"DELETE k FROM {joined}")).rowcount)
    found = conn.execute(text(f"SELECT COUNT(DISTINCT k.handler, k.`key`) FROM {joined}"))
    return int(found.scalar_one())


_jobs, _handlers, _limits = schema.jobs, schema.handlers, schema.rate_limits
_LOSSES: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "0011": (
        ("outbox_inbox", "inbox message ids", lambda c: _count(c, schema.inbox)),
        (
            "outbox_ingest_keys",
            "ingest keys one only apart from another by case, accent or trailing space",
            folded_ingest_keys,
        ),
    ),
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


__all__ = [
    "LockHolder",
    "Loss",
    "RunLockTimeoutError",
    "bounded_lock_waits",
    "downgrade_losses",
    "is_lock_timeout",
    "lock_holders",
    "rerunnable_ddl",
    "run_lock",
    "table_waited_for",
]
