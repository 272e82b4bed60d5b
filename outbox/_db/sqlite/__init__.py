"""SQLite: one writer at a time, and every transaction takes the write lock up front.

Everything outbox needs of SQLite (the ``Database`` protocol of ``dialects.interface``), by
concern: ``connection`` (the write lock up front, WAL, a busy timeout), ``urls`` (files, not
``:memory:``), ``statements`` (no row locks), ``clock`` (text timestamps), ``payload``,
``errors`` (by sqlite3's message) and ``migration`` (the write lock is ``outbox migrate``'s).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from outbox._db.dialects.interface import Supports
from outbox._db.sqlite import clock as clock  # registers the clock's SQL with SQLAlchemy
from outbox._db.sqlite.connection import (
    behind_pooler,
    configure,
    read_committed,
    reading_connection,
    sqlalchemy_dialect,
)
from outbox._db.sqlite.errors import (
    is_lock_timeout,
    is_missing_table,
    is_transient,
    without_values,
)
from outbox._db.sqlite.migration import (
    bounded_lock_waits,
    lock_holders,
    rerunnable_ddl,
    run_lock,
)
from outbox._db.sqlite.payload import row_as_json
from outbox._db.sqlite.statements import (
    add_counts,
    claim,
    claim_returning,
    count_exclusively,
    delete_some,
    ids_written,
    insert_ignoring_duplicates,
    insert_new,
    insert_selected_ignoring_duplicates,
    plan_each_time,
    update_picked,
)
from outbox._db.sqlite.urls import describe, sync_url

PARTITIONS: ModuleType | None = None  # no partitions: retention deletes rows
NAME = "sqlite"
SQLALCHEMY_NAMES = frozenset({"sqlite"})
SUPPORTS = Supports(
    one_statement_claim=False,
    one_statement_completion=False,
    listen_notify=False,
    concurrent_reindex=False,
    zone_free_clock="SQLite's clock is UTC in every connection",
)
# No row locks: claims rely on the write lock taken by BEGIN IMMEDIATE.
SKIP_LOCKED = False
ENGINE_OPTIONS: Mapping[str, Any] = {}

__all__ = [
    "ENGINE_OPTIONS",
    "NAME",
    "PARTITIONS",
    "SKIP_LOCKED",
    "SQLALCHEMY_NAMES",
    "SUPPORTS",
    "add_counts",
    "behind_pooler",
    "bounded_lock_waits",
    "claim",
    "claim_returning",
    "configure",
    "count_exclusively",
    "delete_some",
    "describe",
    "ids_written",
    "insert_ignoring_duplicates",
    "insert_new",
    "insert_selected_ignoring_duplicates",
    "is_lock_timeout",
    "is_missing_table",
    "is_transient",
    "lock_holders",
    "plan_each_time",
    "read_committed",
    "reading_connection",
    "rerunnable_ddl",
    "row_as_json",
    "run_lock",
    "sqlalchemy_dialect",
    "sync_url",
    "update_picked",
    "without_values",
]
