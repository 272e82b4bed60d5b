"""PostgreSQL: the database outbox does most in, in fewest round trips.

Everything outbox needs of PostgreSQL (the ``Database`` protocol of ``dialects.interface``),
by concern: ``connection`` (the idle-transaction guard, directly or behind a pooler, and UTC),
``urls`` (asyncpg's URLs on psycopg), ``statements`` (row locks skipped, claims by ``ctid``),
``clock``, ``payload``, ``errors`` (by SQLSTATE) and ``migration`` (``outbox migrate``'s locks).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from outbox._db.dialects.interface import Supports
from outbox._db.postgresql import clock as clock  # registers the clock's SQL with SQLAlchemy
from outbox._db.postgresql import partitions
from outbox._db.postgresql.connection import (
    behind_pooler,
    configure,
    read_committed,
    reading_connection,
    sqlalchemy_dialect,
)
from outbox._db.postgresql.errors import (
    is_lock_timeout,
    is_missing_table,
    is_transient,
    without_values,
)
from outbox._db.postgresql.migration import (
    bounded_lock_waits,
    lock_holders,
    rerunnable_ddl,
    run_lock,
)
from outbox._db.postgresql.payload import row_as_json
from outbox._db.postgresql.statements import (
    add_counts,
    addressable,
    claim,
    claim_returning,
    claimable,
    claimable_rows,
    claimed_by,
    count_exclusively,
    delete_some,
    ids_written,
    insert_ignoring_duplicates,
    insert_new,
    insert_selected_ignoring_duplicates,
    plan_each_time,
    update_picked,
)
from outbox._db.postgresql.urls import describe, sync_url

PARTITIONS: ModuleType | None = partitions
NAME = "postgresql"
SQLALCHEMY_NAMES = frozenset({"postgresql"})
SUPPORTS = Supports(
    one_statement_claim=True,
    one_statement_completion=True,
    listen_notify=True,
    concurrent_reindex=True,
    zone_free_clock="PostgreSQL stores points in time with their zone (timestamptz): "
    "a session's time zone changes how they are shown, not what is stored",
)
SKIP_LOCKED = True
ENGINE_OPTIONS: Mapping[str, Any] = {}

__all__ = [
    "ENGINE_OPTIONS",
    "NAME",
    "PARTITIONS",
    "SKIP_LOCKED",
    "SQLALCHEMY_NAMES",
    "SUPPORTS",
    "add_counts",
    "addressable",
    "behind_pooler",
    "bounded_lock_waits",
    "claim",
    "claim_returning",
    "claimable",
    "claimable_rows",
    "claimed_by",
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
