"""What ``outbox migrate`` runs on SQLite: the database's write lock is every lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from outbox._db.dialects.interface import LockHolder


@contextmanager
def bounded_lock_waits(conn: Connection, seconds: float) -> Iterator[None]:
    """Nothing to set: the busy timeout already bounds the wait for the write lock, the only
    lock SQLite has."""
    yield


def lock_holders(conn: Connection, table: str | None) -> list[LockHolder]:
    """None known: SQLite does not say who holds its write lock."""
    return []


@contextmanager
def run_lock(engine: Engine, wait: float) -> Iterator[Connection | None]:
    """The database's write lock is the run's lock. Yields the connection every revision must
    run on, in one transaction that took the write lock before it read anything (``BEGIN
    IMMEDIATE``, waiting up to the busy timeout, not ``wait``), committed at the end."""
    with engine.connect() as conn, conn.begin():
        if not conn.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            # An engine outbox did not set up: the driver begins no transaction by itself.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn


def rerunnable_ddl(conn: Connection) -> None:
    """Nothing to do: SQLite's DDL is transactional, so a revision stopped half-way has done
    nothing."""
