"""Statements on ``outbox_archive``: archiving a group's rows, reading and pruning."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy import cast as sql_cast

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.types import PrunedChunk, RecentDeadLetters

_archive = schema.archive
_S = TypeVar("_S", bound=Select[Any])


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


def contains_text(column: ColumnElement[Any], text: str) -> ColumnElement[bool]:
    """``column`` holds ``text``, in any case: ``lower()`` on both sides rather than ILIKE,
    which only PostgreSQL has; the text's own wildcards are escaped."""
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return func.lower(column).like(f"%{escaped}%", escape="\\")


def archive_counts(
    conn: Connection, cap: int | None = None, handlers: Collection[str] = ()
) -> dict[tuple[str, str], int]:
    """Archived rows by (handler, status); served by ``ix_outbox_archive_handler_status``.

    With ``cap``, each count of ``handlers``' rows stops at ``cap``: one bounded probe of the
    index per handler and status, where a GROUP BY would read every archived row.
    """
    if cap is None:
        rows = conn.execute(
            select(_archive.c.handler, _archive.c.status, func.count()).group_by(
                _archive.c.handler, _archive.c.status
            )
        )
        return {(h, s): int(n) for h, s, n in rows}
    counts = {}
    for handler in handlers:
        for status in schema.ArchiveStatus:
            capped = (
                select(literal(1))
                .where(_archive.c.handler == handler, _archive.c.status == status.value)
                .limit(cap)
                .subquery()
            )
            n = int(conn.execute(select(func.count()).select_from(capped)).scalar_one())
            if n:
                counts[(handler, status.value)] = n
    return counts


def count_archived(
    conn: Connection,
    *,
    handler: str | None = None,
    statuses: Collection[str] | None = None,
    group_id: uuid.UUID | None = None,
    older_than_seconds: float | None = None,
    group_ids: Collection[uuid.UUID] | None = None,
) -> dict[tuple[str, str], int]:
    """Archived rows matching the filters (``None``: any), by (handler, status): what a replay
    or a prune would take, before it takes it.

    ``ix_outbox_archive_handler_status`` serves the grouping (and the handler's rows), the
    group's or the age's own index the other filters; an operator's question, not a hot path.
    """
    stmt = select(_archive.c.handler, _archive.c.status, func.count()).group_by(
        _archive.c.handler, _archive.c.status
    )
    stmt = _filtered(stmt, handler, statuses, group_id, group_ids)
    if older_than_seconds is not None:
        stmt = stmt.where(_archive.c.archived_at < db_now_plus(-older_than_seconds))
    return {(h, s): int(n) for h, s, n in conn.execute(stmt)}


def count_archived_up_to(
    conn: Connection,
    cap: int,
    *,
    handler: str | None = None,
    statuses: Collection[str] | None = None,
    older_than_seconds: float | None = None,
    group_ids: Collection[uuid.UUID] | None = None,
) -> int:
    """Archived rows matching the filters (``None``: any), counted up to ``cap``: how many a
    prune or a replay is about to take, at a bounded cost however large the archive.

    The ``LIMIT`` inside the subquery stops the scan at ``cap`` rows; the age's index
    (``ix_outbox_archive_archived_at``) or the handler and status index serves the filters.
    """
    stmt = select(literal(1)).select_from(_archive)
    stmt = _filtered(stmt, handler, statuses, None, group_ids)
    if older_than_seconds is not None:
        stmt = stmt.where(_archive.c.archived_at < db_now_plus(-older_than_seconds))
    found = stmt.limit(cap).subquery()
    return int(conn.execute(select(func.count()).select_from(found)).scalar_one())


def _filtered(
    stmt: _S,
    handler: str | None,
    statuses: Collection[str] | None,
    group_id: uuid.UUID | None,
    group_ids: Collection[uuid.UUID] | None = None,
) -> _S:
    if handler is not None:
        stmt = stmt.where(_archive.c.handler == handler)
    if statuses is not None:
        stmt = stmt.where(_archive.c.status.in_(sorted(statuses)))
    if group_id is not None:
        stmt = stmt.where(_archive.c.group_id == group_id)
    if group_ids is not None:
        stmt = stmt.where(_archive.c.group_id.in_(list(group_ids)))
    return stmt


def select_archived(
    conn: Connection,
    *,
    handler: str | None,
    statuses: Collection[str] | None,
    group_id: uuid.UUID | None,
    after_id: int,
    limit: int,
    group_ids: Collection[uuid.UUID] | None = None,
) -> list[dict[str, Any]]:
    """Archived rows matching the filters (``None``: any), by id, after ``after_id`` (keyset
    pagination).

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
    stmt = _filtered(stmt, handler, statuses, group_id, group_ids)
    return [dict(row._mapping) for row in conn.execute(stmt)]


def recent_dead_letters(conn: Connection, since_seconds: float) -> list[RecentDeadLetters]:
    """Per handler, the events dead-lettered in the last ``since_seconds``: how many, and the
    newest one's age and error (the alert ``outbox check`` raises).

    ``ix_outbox_archive_handler_status`` serves both statements (the planner may take
    ``ix_outbox_archive_archived_at`` for a short window instead): dead letters are few next to
    the succeeded rows an archive mostly holds, and the second statement runs once per handler
    that has any.
    """
    dead = _archive.c.status == schema.ArchiveStatus.DEAD
    recent = _archive.c.archived_at >= db_now_plus(-since_seconds)
    counts = conn.execute(
        select(_archive.c.handler, func.count())
        .where(dead, recent)
        .group_by(_archive.c.handler)
        .order_by(_archive.c.handler)
    ).all()
    found = []
    for handler, count in counts:
        age, error = conn.execute(
            select(age_seconds(_archive.c.archived_at), _archive.c.error)
            .where(_archive.c.handler == handler, dead, recent)
            .order_by(_archive.c.archived_at.desc(), _archive.c.id.desc())
            .limit(1)
        ).one()
        found.append(
            RecentDeadLetters(handler, since_seconds, int(count), max(float(age), 0.0), error)
        )
    return found


def delete_archived(conn: Connection, ids: Sequence[int]) -> int:
    """Delete archive rows by id."""
    return conn.execute(delete(_archive).where(_archive.c.id.in_(list(ids)))).rowcount


def delete_old_archived(
    conn: Connection,
    older_than_seconds: float,
    limit: int,
    statuses: Collection[str] | None = None,
    from_archived_at: dt.datetime | None = None,
    skip_days: Collection[dt.date] = (),
) -> PrunedChunk:
    """Delete up to ``limit`` archive rows of ``statuses`` (``None``: any) archived more than
    ``older_than_seconds`` ago, the longest archived first, none archived before
    ``from_archived_at`` nor on the UTC days ``skip_days`` (days whose partition retention
    left whole, to take out in one statement later).

    Two statements rather than ``DELETE ... WHERE id IN (SELECT ... LIMIT n)``, which MariaDB
    refuses; ``ix_outbox_archive_archived_at`` serves the pick. The rows of other statuses stay
    in that index's path: the caller passes the previous chunk's ``last_archived_at`` as
    ``from_archived_at`` so that each pick starts where the last one stopped rather than
    stepping over every kept row again.
    """
    stmt = (
        select(_archive.c.id, _archive.c.archived_at)
        .where(_archive.c.archived_at < db_now_plus(-older_than_seconds))
        .order_by(_archive.c.archived_at)
        .limit(limit)
    )
    stmt = _filtered(stmt, None, statuses, None)
    if from_archived_at is not None:
        # Not "after": rows archived at the same instant may not all have been deleted yet.
        stmt = stmt.where(_archive.c.archived_at >= from_archived_at)
    for day in skip_days:
        start = dt.datetime.combine(day, dt.time(), dt.UTC)
        end = start + dt.timedelta(days=1)
        stmt = stmt.where(or_(_archive.c.archived_at < start, _archive.c.archived_at >= end))
    picked = conn.execute(stmt).all()
    if not picked:
        return PrunedChunk(0, None)
    return PrunedChunk(
        delete_archived(conn, [int(row.id) for row in picked]), picked[-1].archived_at
    )


def browse_archived(
    conn: Connection,
    *,
    handler: str | None,
    statuses: Collection[str] | None,
    group_id: uuid.UUID | None,
    payload: str | None,
    before_id: int | None,
    limit: int,
    scan: int,
) -> list[dict[str, Any]]:
    """Archived rows matching the filters, newest first, before ``before_id`` (keyset
    pagination), the payload as JSON text. ``payload``: only rows whose payload holds this
    text, any case, looked for among the newest ``scan`` rows only: a search of a few rows in
    a million would otherwise read them all. The primary key serves the order; the
    ``handler, status`` index the filters.
    """
    columns = [c for c in _archive.c if c.name != "payload"]
    stmt = select(*columns, sql_cast(_archive.c.payload, Text).label("payload"))
    stmt = _filtered(stmt, handler, statuses, group_id)
    if before_id is not None:
        stmt = stmt.where(_archive.c.id < before_id)
    if payload is not None:
        newest = conn.execute(select(func.max(_archive.c.id))).scalar_one_or_none() or 0
        stmt = stmt.where(
            _archive.c.id > int(newest) - scan,
            contains_text(sql_cast(_archive.c.payload, Text), payload),
        )
    rows = conn.execute(stmt.order_by(_archive.c.id.desc()).limit(limit))
    return [dict(row._mapping) for row in rows]
