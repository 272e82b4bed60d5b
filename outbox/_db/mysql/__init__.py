"""MariaDB and MySQL: SQLAlchemy's "mysql", both of them.

Everything outbox needs of them (the ``Database`` protocol of ``dialects.interface``), by
concern: ``connection`` (READ COMMITTED, the idle-transaction guard, the oldest server outbox
runs on), ``urls``, ``statements`` (rows picked ``FOR UPDATE SKIP LOCKED``, then updated by
id), ``clock`` (UTC, not the session's), ``payload``, ``errors`` (by error number) and
``migration`` (``outbox migrate``'s locks, DDL that can run again).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from outbox._db.dialects.interface import Supports
from outbox._db.mysql import clock as clock  # registers the clock's SQL with SQLAlchemy
from outbox._db.mysql import partitions
from outbox._db.mysql.connection import (
    behind_pooler,
    configure,
    read_committed,
    reading_connection,
    sqlalchemy_dialect,
)
from outbox._db.mysql.errors import (
    is_lock_timeout,
    is_missing_table,
    is_transient,
    without_values,
)
from outbox._db.mysql.migration import (
    bounded_lock_waits,
    lock_holders,
    rerunnable_ddl,
    run_lock,
)
from outbox._db.mysql.payload import row_as_json
from outbox._db.mysql.statements import (
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
from outbox._db.mysql.urls import describe, sync_url

PARTITIONS: ModuleType | None = partitions
NAME = "mysql"  # SQLAlchemy names MariaDB "mysql" too
SQLALCHEMY_NAMES = frozenset({"mysql", "mariadb"})
SUPPORTS = Supports(
    one_statement_claim=False,
    one_statement_completion=False,
    listen_notify=False,
    concurrent_reindex=False,
    zone_free_clock=None,
)
SKIP_LOCKED = True
# At their default, REPEATABLE READ, a claim's locking read also locks index gaps
# (read_committed): the engines outbox creates are READ COMMITTED throughout.
ENGINE_OPTIONS: Mapping[str, Any] = {"isolation_level": "READ COMMITTED"}

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
