"""What differs between the databases, behind one interface: the base every database's
package (``outbox._db.postgresql``, ``sqlite``, ``mysql``) builds on, and what the rest of
outbox asks of them.

``interface``: the ``Database`` protocol each package implements (its ``Statements``, what it
``Supports``, ...). ``registry``: the one list of the packages, and the lookups by name.
``clock`` and ``payload``: the SQL elements and pieces the packages render their own way.
``errors`` and ``connections``: driver errors and engines, handed to the database's package.
Code outside the database layer asks ``supports``.
"""

from __future__ import annotations

from outbox._db.dialects.clock import (
    age_seconds,
    db_now_plus,
    time_plus,
    whole_buckets,
)
from outbox._db.dialects.connections import (
    behind_pooler,
    configure_engine,
    read_committed,
)
from outbox._db.dialects.errors import (
    error_summary,
    is_lock_timeout,
    is_missing_table,
    is_transient,
)
from outbox._db.dialects.interface import (
    Database,
    Statements,
    Supports,
)
from outbox._db.dialects.payload import (
    JSON_AS_TEXT_MARKER,
    MAX_DOUBLE,
    byte_length,
)
from outbox._db.dialects.registry import (
    DATABASES,
    MYSQL,
    POSTGRESQL,
    SQLITE,
    SUPPORTED,
    SUPPORTS,
    database,
    database_named,
    default_dialect,
    dialect_named,
    name_of,
    partitions,
    row_as_json,
    statements,
    supports,
    uses_skip_locked,
)

__all__ = [
    "DATABASES",
    "JSON_AS_TEXT_MARKER",
    "MAX_DOUBLE",
    "MYSQL",
    "POSTGRESQL",
    "SQLITE",
    "SUPPORTED",
    "SUPPORTS",
    "Database",
    "Statements",
    "Supports",
    "age_seconds",
    "behind_pooler",
    "byte_length",
    "configure_engine",
    "database",
    "database_named",
    "db_now_plus",
    "default_dialect",
    "dialect_named",
    "error_summary",
    "is_lock_timeout",
    "is_missing_table",
    "is_transient",
    "name_of",
    "partitions",
    "read_committed",
    "row_as_json",
    "statements",
    "supports",
    "time_plus",
    "uses_skip_locked",
    "whole_buckets",
]
