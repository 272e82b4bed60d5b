"""The database a conformance test runs on, with its outbox engine and the second real
connections that isolation and locking tests need.

Every engine made here gives up on a lock wait after a few seconds (PostgreSQL
``lock_timeout``, MariaDB ``innodb_lock_wait_timeout``, SQLite's busy timeout): a statement
that should not wait fails the test instead of hanging it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Table, create_engine, event, select, text
from sqlalchemy.engine import make_url

from outbox._db import create_outbox_engine, dialects, queries
from tests._support import wait_for

T = TypeVar("T")

LOCK_WAIT_SECONDS = 2.0
"""How long a statement waits for a lock before it fails, unless a test expects a wait."""
EXPECTED_LOCK_WAIT_SECONDS = 10.0
"""How long a statement that a test expects to wait may wait: far longer than the test takes
to let it go on, and still short enough that a statement that never gets the lock fails."""
THREAD_SECONDS = 15.0
"""How long a test waits for a statement it ran in another thread."""

_MARIADB_REFRESH_SECONDS = 0.15
"""Longer than the 0.1 s for which MariaDB serves INNODB_TRX from a cache that every read of
it keeps from being refreshed."""

# Who waits for a lock in this database, now.
_PG_LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)
_MARIADB_LOCK_WAITERS = text(
    "SELECT count(*) FROM information_schema.innodb_trx AS t"
    " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
    " WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
)


def outbox_engine(url: str, lock_wait: float = LOCK_WAIT_SECONDS) -> Engine:
    """An engine as outbox creates it (READ COMMITTED on MariaDB, BEGIN IMMEDIATE on SQLite)
    whose lock waits fail after ``lock_wait`` seconds."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        parsed = parsed.update_query_dict({"options": f"-c lock_timeout={int(lock_wait * 1000)}"})
    elif backend in ("mysql", "mariadb"):
        wait = f"SET SESSION innodb_lock_wait_timeout = {math.ceil(lock_wait)}"
        parsed = parsed.update_query_dict({"init_command": wait})
    engine = create_outbox_engine(parsed)
    if backend == "sqlite":
        # Registered after outbox's own listener, so that this busy timeout is the one kept.
        busy = f"PRAGMA busy_timeout = {int(lock_wait * 1000)}"
        event.listen(engine, "connect", lambda dbapi_connection, _: dbapi_connection.execute(busy))
    return engine


@dataclass
class Database:
    """A migrated, empty database of one kind, for one test."""

    url: str
    engine: Engine
    """The outbox engine most of a test runs on."""
    dialect: str
    """The outbox name of the database (``outbox._db.dialects.name_of``)."""
    _engines: list[Engine] = field(default_factory=list)
    _threads: ThreadPoolExecutor | None = None

    @classmethod
    def open(cls, url: str) -> Database:
        """The database at ``url``, with an outbox engine on it."""
        engine = outbox_engine(url)
        return cls(url, engine, dialects.name_of(engine.dialect), [engine])

    def close(self) -> None:
        """Wait for the statements run in other threads, then dispose of every engine."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
        for engine in self._engines:
            engine.dispose()

    @property
    def supports(self) -> dialects.Supports:
        """What the database can do, as outbox asks it."""
        return dialects.supports(self.dialect)

    @property
    def row_locks(self) -> bool:
        """Whether writers lock rows (and skip those locked): PostgreSQL and MariaDB. SQLite
        has one write lock for the whole database, which a transaction takes at BEGIN."""
        return dialects.uses_skip_locked(self.dialect)

    def other_engine(self, lock_wait: float = LOCK_WAIT_SECONDS) -> Engine:
        """A second outbox engine on the same database: its connections are other sessions."""
        engine = outbox_engine(self.url, lock_wait)
        self._engines.append(engine)
        return engine

    def application_engine(self) -> Engine:
        """An engine as an application makes it: the database's own defaults (MariaDB at
        REPEATABLE READ, SQLite's deferred transactions)."""
        engine = create_engine(self.url)
        self._engines.append(engine)
        return engine

    def set_session_time_zone(self, conn: Connection, offset: str) -> None:
        """Put a session in the time zone at ``offset`` from UTC (``-05:00``), as an
        application may (SQLite has no session time zone)."""
        if self.dialect == dialects.POSTGRESQL:
            conn.execute(text(f"SET TIME ZONE INTERVAL '{offset}' HOUR TO MINUTE"))
        elif self.dialect == dialects.MYSQL:
            conn.execute(text(f"SET time_zone = '{offset}'"))

    def in_thread(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` in another thread (a statement that is expected to wait)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="conformance")
        return self._threads.submit(work)

    def lock_waiters(self) -> int:
        """How many sessions of this database wait for a lock now (PostgreSQL, MariaDB)."""
        query = _PG_LOCK_WAITERS if self.dialect == dialects.POSTGRESQL else _MARIADB_LOCK_WAITERS
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def wait_for_lock_waiter(self) -> None:
        """Return once a session of this database waits for a lock."""
        # MariaDB refreshes INNODB_TRX only when nobody read it for 0.1 s: read it less often.
        pause = _MARIADB_REFRESH_SECONDS if self.dialect == dialects.MYSQL else 0.0

        def waiting() -> bool:
            time.sleep(pause)
            return self.lock_waiters() > 0

        wait_for(waiting, "a session to wait for a lock")

    @contextmanager
    def row_locked(self, table: Table, row_id: int) -> Iterator[Connection]:
        """Hold ``SELECT ... FOR UPDATE`` on one row in another session's open transaction."""
        with self.other_engine().connect() as conn:
            conn.execute(select(table.c.id).where(table.c.id == row_id).with_for_update())
            try:
                yield conn
            finally:
                conn.rollback()

    def now(self) -> datetime:
        """The database clock."""
        with self.engine.connect() as conn:
            now: datetime = queries.database_now(conn)
            return now

    def seconds_from_now(self, moment: Any) -> float:
        """Seconds from the database's now to ``moment`` (negative when it is past)."""
        return float((moment - self.now()).total_seconds())

    def run(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one transaction of the outbox engine, and commit it."""
        with self.engine.begin() as conn:
            return work(conn)
