"""What ``outbox migrate`` runs on PostgreSQL: ``lock_timeout``, the sessions in ``pg_locks``,
an advisory lock for one run at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from outbox._db.dialects.interface import LockHolder, RunLockTimeoutError
from outbox._db.postgresql.errors import is_lock_timeout

# The key of the advisory lock that serializes ``outbox migrate``: advisory locks belong to one
# database, so runs on other databases of the server never wait for it.
_RUN_LOCK_KEY = 0x6F7574626F78  # "outbox" in ASCII


@contextmanager
def bounded_lock_waits(conn: Connection, seconds: float) -> Iterator[None]:
    """``SET LOCAL lock_timeout``, which ends with the transaction (and so works behind a
    pooler in transaction mode); no statement timeout."""
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{max(1, round(seconds * 1000))}ms'")
    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
    yield


def lock_holders(conn: Connection, table: str | None) -> list[LockHolder]:
    """The sessions holding a lock on the table (``pg_locks``), longest open first."""
    if table is None:
        return []
    rows = conn.exec_driver_sql(
        "SELECT DISTINCT a.pid, EXTRACT(EPOCH FROM now() - a.xact_start),"
        " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 60), a.xact_start"
        " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.relation = to_regclass(%(table)s) AND l.granted"
        " AND l.pid <> pg_backend_pid() ORDER BY a.xact_start",
        {"table": table},
    ).all()
    return [
        LockHolder(int(r[0]), None if r[1] is None else float(r[1]), str(r[2] or "")) for r in rows
    ]


@contextmanager
def run_lock(engine: Engine, wait: float) -> Iterator[Connection | None]:
    """A transaction-scoped advisory lock in a transaction of its own, held open on a dedicated
    connection (a pooler in transaction mode keeps one server connection for it). Yields None:
    each revision runs on a connection of its own."""
    with engine.connect() as conn:
        _take_run_lock(conn, wait)
        try:
            yield None
        finally:
            conn.rollback()


def _take_run_lock(conn: Connection, wait: float) -> None:
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{max(1, round(wait * 1000))}ms'")
    try:
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _RUN_LOCK_KEY})
    except DBAPIError as error:
        if not is_lock_timeout(error.orig):
            raise
        conn.rollback()
        holder = conn.exec_driver_sql(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND ((classid::bigint << 32) | objid::bigint) = %(key)s LIMIT 1",
            {"key": _RUN_LOCK_KEY},
        ).scalar()
        conn.rollback()
        raise RunLockTimeoutError(None if holder is None else int(holder)) from error


def rerunnable_ddl(conn: Connection) -> None:
    """Nothing to do: PostgreSQL's DDL is transactional, so a revision stopped half-way has
    done nothing."""
