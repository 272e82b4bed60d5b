"""Driver errors classified once: contention worth a retry, a missing table, a summary.

Each database's package reads its own drivers' errors (its ``errors`` module); an error is
classified by the first package of the registry that recognises it.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError

from outbox._db.dialects.registry import DATABASES


def is_transient(error: BaseException) -> bool:
    """True for contention and dropped connections: run the transaction again, it may pass."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    for database in DATABASES:
        answer = database.is_transient(orig, error)
        if answer is not None:
            return answer
    return False


def is_missing_table(error: BaseException) -> bool:
    """True when a statement failed because a table (or its schema) does not exist.

    Never transient: running the transaction again finds the table missing again. Which
    table it was, the caller finds out by looking (``_db.missing_buffer_tables``).
    """
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    for database in DATABASES:
        answer = database.is_missing_table(orig)
        if answer is not None:
            return answer
    return False


def is_lock_timeout(error: BaseException) -> bool:
    """True when a statement gave up waiting for a lock (``migration.bounded_lock_waits``)."""
    orig = getattr(error, "orig", None)
    for database in DATABASES:
        answer = database.is_lock_timeout(orig)
        if answer is not None:
            return answer
    return False


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
    for database in DATABASES:
        primary = database.without_values(primary)
    sqlstate = getattr(target, "sqlstate", None)
    state = f" [{sqlstate}]" if sqlstate else ""
    return f"{type(target).__name__}{state}: {primary}" if primary else type(target).__name__
