"""Statements an operator's questions about groups ask: which groups there are and where each
stands, one group in full, its attempts, and the record of what operators did.

None is a hot path: each reads at most a page of rows (``limit``), and each count stops at a
cap, so that a question about a huge table costs a bounded amount of work.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    Text,
    and_,
    case,
    exists,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast

from outbox import schema
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.queries.archive import contains_text
from outbox._db.queries.handlers import paused_now
from outbox._db.queries.held import key_text
from outbox._db.types import GroupFilter, GroupRow
from outbox.schema import db_now

_jobs = schema.jobs
_archive = schema.archive
_held = schema.held_keys
_handlers = schema.handlers
_attempts = schema.attempts
_operations = schema.operations

LIVE = (
    schema.GroupStatus.IN_FLIGHT,
    schema.GroupStatus.WAITING,
    schema.GroupStatus.RETRYING,
    schema.GroupStatus.DEFERRED,
    schema.GroupStatus.PAUSED,
    schema.GroupStatus.REFUSED,
)
"""The statuses of a group that has a job: its events are in its buffer."""
ARCHIVED = (schema.GroupStatus.HELD, schema.GroupStatus.DEAD)
"""The statuses of a dead group: its events are in the archive."""


# A group leased now, or held as refused, has no next run to tell.
_NOT_DUE = (schema.GroupStatus.IN_FLIGHT.value, schema.GroupStatus.REFUSED.value)


def _live_status() -> ColumnElement[str]:
    """Where a group with a job stands, the first that holds of: refused (held with no
    expiry), in flight (leased), paused (its handler is), retrying (attempted), deferred (put
    off by its downstream), waiting."""
    handler_paused = exists(
        select(_handlers.c.name).where(_handlers.c.name == _jobs.c.handler, paused_now())
    )
    return case(
        (
            and_(_jobs.c.lease_token.is_not(None), _jobs.c.lease_expires_at.is_(None)),
            schema.GroupStatus.REFUSED.value,
        ),
        (_jobs.c.lease_token.is_not(None), schema.GroupStatus.IN_FLIGHT.value),
        (handler_paused, schema.GroupStatus.PAUSED.value),
        (_jobs.c.attempts > 0, schema.GroupStatus.RETRYING.value),
        (_jobs.c.deferrals > 0, schema.GroupStatus.DEFERRED.value),
        else_=schema.GroupStatus.WAITING.value,
    )


def _live(where: GroupFilter) -> Select[Any]:
    status = _live_status().label("status")
    stmt = select(
        _jobs.c.id,
        _jobs.c.handler,
        _jobs.c.group_id,
        status,
        _jobs.c.attempts,
        _jobs.c.deferrals,
        age_seconds(_jobs.c.created_at).label("age"),
        age_seconds(_jobs.c.run_at).label("overdue"),
        _jobs.c.lease_owner,
        _jobs.c.last_error,
    ).where(_jobs.c.kind == schema.JobKind.BATCH)
    if where.handlers is not None:
        stmt = stmt.where(_jobs.c.handler.in_(sorted(where.handlers)))
    if where.statuses is not None:
        stmt = stmt.where(_live_status().in_(sorted(where.statuses)))
    if where.older_than is not None:
        stmt = stmt.where(_jobs.c.created_at < db_now_plus(-where.older_than))
    if where.error is not None:
        stmt = stmt.where(contains_text(_jobs.c.last_error, where.error))
    if where.group_ids is not None:
        stmt = stmt.where(_jobs.c.group_id.in_(list(where.group_ids)))
    return stmt


def live_groups(
    conn: Connection, where: GroupFilter, *, after: int | None = None, limit: int
) -> list[GroupRow]:
    """Groups that have a job (``LIVE``), oldest first, at most ``limit``, after the one at
    ``after`` (its ``position``: keyset pagination). ``None``: any.

    The job table holds a row per group in flight or waiting, not per event: small next to the
    buffers. ``statuses`` are :class:`outbox.schema.GroupStatus` values."""
    stmt = _live(where)
    if after is not None:
        stmt = stmt.where(_jobs.c.id > after)
    return [
        GroupRow(
            position=int(row.id),
            handler=row.handler,
            group_id=row.group_id,
            status=row.status,
            attempts=int(row.attempts),
            deferrals=int(row.deferrals),
            age=max(float(row.age), 0.0),
            due_in=None if row.status in _NOT_DUE else -float(row.overdue),
            worker=row.lease_owner,
            error=row.last_error,
        )
        for row in conn.execute(stmt.order_by(_jobs.c.id).limit(limit))
    ]


def count_live_groups(conn: Connection, where: GroupFilter, *, cap: int) -> dict[str, int]:
    """Groups with a job by status, counting at most ``cap`` of them in all: exact when the
    total is below ``cap``."""
    picked = _live(where).limit(cap).subquery()
    rows = conn.execute(select(picked.c.status, func.count()).group_by(picked.c.status))
    return {status: int(n) for status, n in rows}


def _dead(where: GroupFilter) -> Select[Any]:
    holds = exists(select(_held.c.key).where(_held.c.group_id == _archive.c.group_id))
    stmt = select(_archive.c.handler, _archive.c.group_id).where(
        _archive.c.status == schema.ArchiveStatus.DEAD, _archive.c.group_id.is_not(None)
    )
    if where.handlers is not None:
        stmt = stmt.where(_archive.c.handler.in_(sorted(where.handlers)))
    wanted = set(ARCHIVED) if where.statuses is None else set(where.statuses) & set(ARCHIVED)
    if wanted == {schema.GroupStatus.HELD}:
        stmt = stmt.where(holds)
    elif wanted == {schema.GroupStatus.DEAD}:
        stmt = stmt.where(~holds)
    elif not wanted:
        stmt = stmt.where(literal(False))
    if where.older_than is not None:
        stmt = stmt.where(_archive.c.archived_at < db_now_plus(-where.older_than))
    if where.error is not None:
        stmt = stmt.where(contains_text(_archive.c.error, where.error))
    if where.group_ids is not None:
        stmt = stmt.where(_archive.c.group_id.in_(list(where.group_ids)))
    if where.payload is not None:
        stmt = stmt.where(contains_text(sql_cast(_archive.c.payload, Text), where.payload))
    return stmt


def dead_groups(
    conn: Connection, where: GroupFilter, *, after: int | None = None, limit: int
) -> list[GroupRow]:
    """Dead groups (``ARCHIVED``: held when one of their keys is held), the longest dead
    first, at most ``limit``, after the one at ``after`` (its ``position``: its first archive
    row's id); ``payload``: only groups with an event whose payload holds that text (any
    case). ``ix_outbox_archive_handler_status`` serves the pick."""
    picked = _dead(where).add_columns(_archive.c.id).subquery()
    first_id = func.min(picked.c.id)
    grouped = select(picked.c.handler, picked.c.group_id, first_id.label("first")).group_by(
        picked.c.handler, picked.c.group_id
    )
    if after is not None:
        grouped = grouped.having(first_id > after)
    first = grouped.order_by(first_id).limit(limit).subquery()
    stmt = select(
        first.c.first,
        first.c.handler,
        first.c.group_id,
        _archive.c.attempts,
        _archive.c.error,
        age_seconds(_archive.c.archived_at).label("age"),
        exists(select(_held.c.key).where(_held.c.group_id == first.c.group_id)).label("holds"),
    ).join(_archive, _archive.c.id == first.c.first)
    return [
        GroupRow(
            position=int(row.first),
            handler=row.handler,
            group_id=row.group_id,
            status=(schema.GroupStatus.HELD if row.holds else schema.GroupStatus.DEAD).value,
            attempts=int(row.attempts),
            deferrals=0,
            age=max(float(row.age), 0.0),
            due_in=None,
            worker=None,
            error=row.error,
        )
        for row in conn.execute(stmt.order_by(first.c.first))
    ]


def count_dead_groups(conn: Connection, where: GroupFilter, *, cap: int) -> dict[str, int]:
    """Dead groups by status (held or dead), at most ``cap`` of them in all."""
    holds = exists(select(_held.c.key).where(_held.c.group_id == _archive.c.group_id))
    picked = _dead(where).add_columns(holds.label("holds")).distinct().limit(cap).subquery()
    rows = conn.execute(select(picked.c.holds, func.count()).group_by(picked.c.holds))
    return {
        (schema.GroupStatus.HELD if holds else schema.GroupStatus.DEAD).value: int(n)
        for holds, n in rows
    }


def groups_with_key(
    conn: Connection, table: Table, key_name: str, handler: str, key: str, limit: int
) -> list[uuid.UUID]:
    """The groups (with a job, or dead) that hold an event whose ``key_name`` is ``key`` (as
    text), at most ``limit`` of each: the buffer's rows in a group, the held keys, and the
    archive's dead rows of the handler whose payload names the key."""
    live = conn.execute(
        select(table.c.group_id)
        .where(key_text(table.c[key_name]) == key, table.c.group_id.is_not(None))
        .distinct()
        .limit(limit)
    ).scalars()
    held = conn.execute(
        select(_held.c.group_id).where(_held.c.handler == handler, _held.c.key == key).limit(limit)
    ).scalars()
    dead = conn.execute(
        select(_archive.c.group_id)
        .where(
            _archive.c.handler == handler,
            _archive.c.status == schema.ArchiveStatus.DEAD,
            _archive.c.group_id.is_not(None),
            contains_text(sql_cast(_archive.c.payload, Text), key),
        )
        .distinct()
        .limit(limit)
    ).scalars()
    return list(dict.fromkeys([*live, *held, *dead]))


def group_job(conn: Connection, group_id: uuid.UUID) -> GroupRow | None:
    """A group's job, where it stands; None when it has none."""
    rows = live_groups(conn, GroupFilter(group_ids=[group_id]), limit=1)
    return rows[0] if rows else None


def lease_of(conn: Connection, group_id: uuid.UUID) -> tuple[Any, Any] | None:
    """A leased group's lease: seconds until it expires (None: held as refused) and its
    holder's seconds since its last heartbeat (None: no such worker row)."""
    workers = schema.workers
    row = conn.execute(
        select(
            age_seconds(_jobs.c.lease_expires_at).label("expires"),
            age_seconds(workers.c.heartbeat_at).label("heartbeat"),
        )
        .select_from(_jobs.outerjoin(workers, workers.c.id == _jobs.c.lease_owner))
        .where(_jobs.c.group_id == group_id, _jobs.c.lease_token.is_not(None))
    ).first()
    if row is None:
        return None
    return (
        None if row.expires is None else -float(row.expires),
        None if row.heartbeat is None else max(float(row.heartbeat), 0.0),
    )


def mark_archived(
    conn: Connection,
    ids: Sequence[int],
    *,
    status: str,
    operation_id: int,
    replay_event_ids: dict[int, int] | None = None,
) -> int:
    """Mark archive rows with a new status and the operation that changed it (a replay: each
    row's new event id, by archive id)."""
    if not ids:
        return 0
    if not replay_event_ids:
        return conn.execute(
            update(_archive)
            .where(_archive.c.id.in_(list(ids)))
            .values(status=status, operation_id=operation_id)
        ).rowcount
    new_id = case(replay_event_ids, value=_archive.c.id, else_=None)
    return conn.execute(
        update(_archive)
        .where(_archive.c.id.in_(list(ids)))
        .values(status=status, operation_id=operation_id, replay_event_id=new_id)
    ).rowcount


def discard_dead_rows(conn: Connection, group_ids: Sequence[uuid.UUID], operation_id: int) -> int:
    """Mark the dead archive rows of groups as discarded by an operation; how many."""
    if not group_ids:
        return 0
    return conn.execute(
        update(_archive)
        .where(
            _archive.c.group_id.in_(list(group_ids)),
            _archive.c.status == schema.ArchiveStatus.DEAD,
        )
        .values(status=schema.ArchiveStatus.DISCARDED.value, operation_id=operation_id)
    ).rowcount


def delete_idle_job(conn: Connection, group_id: uuid.UUID) -> bool:
    """Delete a group's job unless a worker holds it now (leased with an expiry): the fence an
    operator's discard takes against a worker. A refused job (held with no expiry) may go."""
    result = conn.execute(
        _jobs.delete().where(
            _jobs.c.group_id == group_id,
            _jobs.c.kind == schema.JobKind.BATCH,
            or_(_jobs.c.lease_token.is_(None), _jobs.c.lease_expires_at.is_(None)),
        )
    )
    return result.rowcount == 1


def retry_job_now(conn: Connection, group_id: uuid.UUID) -> bool:
    """Make a group's job due now unless a worker holds it (leased, or held as refused): an
    operator's retry. Its attempts and deferrals stay counted. Served by
    ``uq_outbox_jobs_group_id``."""
    result = conn.execute(
        update(_jobs)
        .where(
            _jobs.c.group_id == group_id,
            _jobs.c.kind == schema.JobKind.BATCH,
            _jobs.c.lease_token.is_(None),
        )
        .values(run_at=db_now())
    )
    return result.rowcount == 1


def count_events_of_groups(
    conn: Connection, table: Table, group_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, int]:
    """Events in a buffer per group; served by ``ix_<table>_group_id``."""
    rows = conn.execute(
        select(table.c.group_id, func.count())
        .where(table.c.group_id.in_(list(group_ids)))
        .group_by(table.c.group_id)
    )
    return {g: int(n) for g, n in rows}


def count_dead_events(conn: Connection, group_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Dead events in the archive per group; served by ``ix_outbox_archive_group_id``."""
    rows = conn.execute(
        select(_archive.c.group_id, func.count())
        .where(
            _archive.c.group_id.in_(list(group_ids)),
            _archive.c.status == schema.ArchiveStatus.DEAD,
        )
        .group_by(_archive.c.group_id)
    )
    return {g: int(n) for g, n in rows}


def archived_age(conn: Connection, group_id: uuid.UUID) -> float | None:
    """Seconds since a group's last event was archived; None when none is. Served by
    ``ix_outbox_archive_group_id``."""
    age = conn.execute(
        select(func.min(age_seconds(_archive.c.archived_at))).where(_archive.c.group_id == group_id)
    ).scalar_one_or_none()
    return None if age is None else max(float(age), 0.0)


def archived_of_group(conn: Connection, group_id: uuid.UUID) -> dict[str, int]:
    """A group's events in the archive by status."""
    rows = conn.execute(
        select(_archive.c.status, func.count())
        .where(_archive.c.group_id == group_id)
        .group_by(_archive.c.status)
    )
    return {s: int(n) for s, n in rows}


def mark_group_operation(conn: Connection, group_id: uuid.UUID, operation_id: int) -> int:
    """Mark the archive rows of a group that no operation has marked with ``operation_id``:
    the rows an operator's discard just archived."""
    return conn.execute(
        update(_archive)
        .where(_archive.c.group_id == group_id, _archive.c.operation_id.is_(None))
        .where(_archive.c.status == schema.ArchiveStatus.DISCARDED)
        .values(operation_id=operation_id)
    ).rowcount
