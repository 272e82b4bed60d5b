"""Statements on ``outbox_archive``: archiving a group's rows, reading and pruning."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy import cast as sql_cast

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import db_now_plus

_archive = schema.archive


# What an archive row is made of, in the order :func:`archive_source` selects it.
ARCHIVE_COLUMNS = (
    "handler",
    "buffer",
    "event_id",
    "group_id",
    "status",
    "attempts",
    "error",
    "payload",
    "created_at",
)


def archive_source(
    dialect: str,
    table: Table,
    row: Any,
    *,
    handler: Any,
    status: str,
    attempts: Any,
    error: str | None,
    lenient: bool,
) -> Any:
    """The archive rows of ``row`` (an alias or CTE of a buffer's rows named ``outbox_row``)
    for ``INSERT INTO outbox_archive (ARCHIVE_COLUMNS) SELECT ...``; ``handler`` and
    ``attempts`` are SQL expressions (literals, or bound parameters of a cached statement)."""
    return select(
        handler,
        literal(table.name, String),
        row.c.id,
        row.c.group_id,
        literal(status, String),
        attempts,
        literal(error, Text),
        dialects.row_as_json(dialect, row, lenient=lenient),
        row.c.created_at,
    )


def archive_group_rows(
    conn: Connection,
    dialect: str,
    table: Table,
    *,
    handler: str,
    group_id: uuid.UUID,
    status: str,
    attempts: int,
    error: str | None,
    event_ids: Iterable[int] | None = None,
    older_than: float | None = None,
    lenient: bool = False,
) -> int:
    """Copy a group's rows (all, only ``event_ids``, or only those older than ``older_than``
    seconds) into ``outbox_archive``.

    One set-based ``INSERT ... SELECT``: the payload is built by the database, no row passes
    through Python.
    """
    row = table.alias("outbox_row")
    source = archive_source(
        dialect,
        table,
        row,
        handler=literal(handler, String),
        status=status,
        attempts=literal(attempts, Integer),
        error=error,
        lenient=lenient,
    ).where(row.c.group_id == group_id)
    if event_ids is not None:
        source = source.where(row.c.id.in_(list(event_ids)))
    if older_than is not None:
        source = source.where(row.c.created_at < db_now_plus(-older_than))
    stmt = insert(_archive).from_select(ARCHIVE_COLUMNS, source)
    # SQLAlchemy keeps the rowcount of INSERTs only when asked to.
    return conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount


def archive_counts(conn: Connection) -> dict[tuple[str, str], int]:
    """Archived rows by (handler, status); served by ``ix_outbox_archive_handler_status``."""
    rows = conn.execute(
        select(_archive.c.handler, _archive.c.status, func.count()).group_by(
            _archive.c.handler, _archive.c.status
        )
    )
    return {(h, s): int(n) for h, s, n in rows}


def select_archived(
    conn: Connection,
    *,
    handler: str | None,
    status: str | None,
    group_id: uuid.UUID | None,
    after_id: int,
    limit: int,
) -> list[dict[str, Any]]:
    """Archived rows matching the filters, by id, after ``after_id`` (keyset pagination).

    The payload comes back as JSON *text*: parsed by the caller, one row at a time, with exact
    decimals, rather than by the driver with floats (and all or nothing).
    """
    columns = [c for c in _archive.c if c.name != "payload"]
    stmt = (
        select(*columns, sql_cast(_archive.c.payload, Text).label("payload"))
        .where(_archive.c.id > after_id)
        .order_by(_archive.c.id)
        .limit(limit)
    )
    if handler is not None:
        stmt = stmt.where(_archive.c.handler == handler)
    if status is not None:
        stmt = stmt.where(_archive.c.status == status)
    if group_id is not None:
        stmt = stmt.where(_archive.c.group_id == group_id)
    return [dict(row._mapping) for row in conn.execute(stmt)]


def delete_archived(conn: Connection, ids: Sequence[int]) -> int:
    """Delete archive rows by id."""
    return conn.execute(delete(_archive).where(_archive.c.id.in_(list(ids)))).rowcount


def delete_old_archived(conn: Connection, older_than_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` archive rows archived more than ``older_than_seconds`` ago.

    Two statements rather than ``DELETE ... WHERE id IN (SELECT ... LIMIT n)``, which MariaDB
    refuses; ``ix_outbox_archive_archived_at`` serves the pick.
    """
    ids = list(
        conn.execute(
            select(_archive.c.id)
            .where(_archive.c.archived_at < db_now_plus(-older_than_seconds))
            .order_by(_archive.c.archived_at)
            .limit(limit)
        ).scalars()
    )
    return delete_archived(conn, ids) if ids else 0
