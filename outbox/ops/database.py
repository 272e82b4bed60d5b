"""The database an application points at: its URL and driver, the checks that it answers and
holds outbox's tables of a generation this outbox works with, a dialect to compile DDL for, and
a database error in one line.

What the command line (and any other face) asks of a database before it runs anything. The
answers come from the database layer (``outbox._db``), which keeps the SQL; this module is
where a face asks, so that no face imports that layer.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from outbox import _db
from outbox._db import (
    URL_FORM,
    check_buffer_tables,
    check_connection,
    check_schema,
    describe,
    parse_url,
)
from outbox._db.dialects import SUPPORTED, dialect_named, error_summary
from outbox._db.generation import check as check_generation
from outbox._db.generation import recorded_incompatibility

__all__ = [
    "SUPPORTED",
    "URL_FORM",
    "check_buffer_tables",
    "check_connection",
    "check_generation",
    "check_schema",
    "describe",
    "dialect_named",
    "error_summary",
    "load_driver",
    "parse_url",
    "recorded_incompatibility",
]


def load_driver(url: URL) -> None:
    """Import the SQLAlchemy dialect and database driver outbox connects to ``url`` with (for
    an async driver's URL, its sync sibling's), connecting to nothing.

    A URL outbox cannot connect with (an async driver it does not know, a private SQLite
    ``:memory:`` database), a dialect SQLAlchemy does not know, or a driver that is not
    installed, is a ConfigurationError saying so.
    """
    _db.load_driver(_db.sync_url(url))
