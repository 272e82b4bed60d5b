"""SQLite's errors (sqlite3's), classified by their message: the database locked, a missing
table; and the text it quotes kept out of a summary."""

from __future__ import annotations

import re

# sqlite3 quotes the offending text when it cannot decode a value: never repeat it.
_QUOTED_TEXT = re.compile(r" with text '.*", re.DOTALL)


def is_transient(orig: object, error: BaseException) -> bool | None:
    """The database (or a table) locked by another connection; None otherwise."""
    message = str(orig).lower()
    if "database is locked" in message or "database table is locked" in message:
        return True
    return None


def is_missing_table(orig: object) -> bool | None:
    """sqlite3's "no such table"; None otherwise."""
    return True if str(orig).lower().startswith("no such table") else None


def is_lock_timeout(orig: object) -> bool | None:
    """None: the busy timeout bounds the wait for the write lock, and a migration does not
    tell it apart."""
    return None


def without_values(message: str) -> str:
    """``message`` without the text sqlite3 quotes when it cannot decode a value."""
    return _QUOTED_TEXT.sub("", message)
