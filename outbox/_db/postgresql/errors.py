"""PostgreSQL's errors, classified by their SQLSTATE: contention worth a retry, a missing
table, a lock wait given up."""

from __future__ import annotations

from sqlalchemy.exc import OperationalError

# SQLSTATEs of contention that goes away when the transaction is simply run again.
_TRANSIENT = {
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
_MISSING_TABLE = {"42P01", "3F000"}  # undefined_table, invalid_schema_name
_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout, advisory locks included


def is_transient(orig: object, error: BaseException) -> bool | None:
    """Contention by its SQLSTATE; a refused or broken connection (a restarting server),
    which psycopg reports with no SQLSTATE; None for an error of another database."""
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _TRANSIENT
    if type(orig).__module__.startswith("psycopg") and isinstance(error, OperationalError):
        return True
    return None


def is_missing_table(orig: object) -> bool | None:
    """An undefined table or schema; None for an error with no SQLSTATE."""
    sqlstate = getattr(orig, "sqlstate", None)
    return None if sqlstate is None else sqlstate in _MISSING_TABLE


def is_lock_timeout(orig: object) -> bool | None:
    """``lock_timeout`` expired; None for an error with no SQLSTATE."""
    sqlstate = getattr(orig, "sqlstate", None)
    return None if sqlstate is None else sqlstate == _LOCK_NOT_AVAILABLE


def without_values(message: str) -> str:
    """``message`` itself: PostgreSQL's primary message quotes no value (its DETAIL and CONTEXT
    do, and are never read)."""
    return message
