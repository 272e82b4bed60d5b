"""MariaDB's and MySQL's errors, classified by their error number: contention worth a retry,
a missing table, a lock wait given up."""

from __future__ import annotations

from typing import Any

# Lock wait timeout, deadlock, lock wait with NOWAIT, server shutting down, server gone away,
# connection lost, cannot connect.
_TRANSIENT = {1205, 1213, 3572, 1053, 2006, 2013, 2003}
_NO_SUCH_TABLE = 1146
_LOCK_WAIT_TIMEOUT = 1205  # metadata locks (lock_wait_timeout) and row locks alike


def _errno(orig: object) -> int | None:
    """A MariaDB or MySQL driver error's number (its first argument); None for other drivers,
    whose first argument is the message. Asked first: PyMySQL's errors carry a SQLSTATE too,
    but a coarse one (a lock wait timeout's is the general HY000)."""
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_transient(orig: object, error: BaseException) -> bool | None:
    """Contention and lost connections by error number; None for another database's error."""
    errno = _errno(orig)
    return None if errno is None else errno in _TRANSIENT


def is_missing_table(orig: object) -> bool | None:
    """No such table; None for another database's error."""
    errno = _errno(orig)
    return None if errno is None else errno == _NO_SUCH_TABLE


def is_lock_timeout(orig: object) -> bool | None:
    """A lock wait timed out; None for another database's error."""
    errno = _errno(orig)
    return None if errno is None else errno == _LOCK_WAIT_TIMEOUT


def without_values(message: str) -> str:
    """``message`` itself: MariaDB's primary message is what a summary shows."""
    return message
