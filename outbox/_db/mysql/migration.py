"""What ``outbox migrate`` runs on MariaDB and MySQL: the session's lock waits, the sessions
that may hold a metadata lock, a named lock for one run at a time, and DDL that can run again
(each DDL statement commits by itself there)."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, event

from outbox._db.dialects.interface import LockHolder, RunLockTimeoutError


@contextmanager
def bounded_lock_waits(conn: Connection, seconds: float) -> Iterator[None]:
    """The session's metadata-lock and row-lock waits, whole seconds (at least 1), set back as
    they were afterwards."""
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


def lock_holders(conn: Connection, table: str | None) -> list[LockHolder]:
    """The sessions holding the table's metadata lock where the ``METADATA_LOCK_INFO`` plugin
    is installed; else the sessions with an open transaction (``INNODB_TRX``), which are the
    candidates."""
    return [
        LockHolder(int(r[0]), None if r[1] is None else float(r[1]), str(r[2] or ""))
        for r in _lock_holder_rows(conn, table)
    ]


def _lock_holder_rows(conn: Connection, table: str | None) -> list[Any]:
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


@contextmanager
def run_lock(engine: Engine, wait: float) -> Iterator[Connection | None]:
    """A named lock (``GET_LOCK``), named after the database, as its names are the server's.
    Yields None: each revision runs on a connection of its own."""
    with engine.connect() as conn:
        name = _run_lock_name(conn)
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


def _run_lock_name(conn: Connection) -> str:
    database = str(conn.exec_driver_sql("SELECT DATABASE()").scalar() or "")
    name = f"outbox_migrate.{database}"
    # A lock's name has at most 64 characters.
    return name if len(name) <= 64 else hashlib.sha256(name.encode()).hexdigest()


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
    a revision stopped half-way can run again whole (MySQL has no such forms: nothing)."""
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
