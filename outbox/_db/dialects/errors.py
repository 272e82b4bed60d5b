"""Driver errors classified once: contention worth a retry, a missing table, a summary."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

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
