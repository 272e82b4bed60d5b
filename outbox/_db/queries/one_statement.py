"""PostgreSQL's one-round-trip statements on buffer tables: a claim job's claim with its batch
job (``Supports.one_statement_claim``), and a succeeded group's completion
(``Supports.one_statement_completion``). The callers ask ``supports`` first; every other
database runs the same steps as separate statements (``buffers``, ``jobs``)."""

from __future__ import annotations

import functools
import uuid
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    String,
    Table,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    true,
    type_coerce,
    union_all,
    update,
)

from outbox import schema
from outbox._db import postgresql
from outbox._db.dialects.clock import db_now_plus
from outbox._db.queries.archive import ARCHIVE_COLUMNS, archive_source
from outbox._db.queries.buffers import fetch_claimed
from outbox._db.queries.jobs import batch_job_values
from outbox._db.types import LeasedClaim
from outbox.schema import db_now

_jobs = schema.jobs
_archive = schema.archive


def claim_group_with_job(
    conn: Connection,
    table: Table,
    *,
    group_id: uuid.UUID,
    limit: int,
    held: tuple[int, uuid.UUID, float] | None,
    handler: str,
    priority: int,
    lease: tuple[str, uuid.UUID, float],
) -> LeasedClaim:
    """PostgreSQL: claim up to ``limit`` rows, create their batch job leased to the claiming
    worker, and return the rows, the job's id and whether more rows wait, in one round trip.

    ``held``: (id, token, lease seconds) of the claim job this claim runs for, or None. Its
    ``held`` CTE pushes that lease back and gates the locking CTE: when the lease is lost,
    nothing is claimed. An empty result cannot tell "nothing to claim" from "lease lost": the
    caller's fenced finishing write tells. ``lease``: (worker id, token, seconds) of the new
    batch job, which is inserted only when rows were claimed.

    ``more`` is read from the partial index in the statement's snapshot, past the last
    claimed id; rows other claimers hold locked still count.
    """
    owner, token, seconds = lease
    params: dict[str, Any] = {
        "outbox_group_id": group_id,
        "outbox_handler": handler,
        "outbox_priority": priority,
        "outbox_owner": owner,
        "outbox_token": token,
        "outbox_seconds": seconds,
    }
    if held is not None:
        params.update(
            outbox_held_id=held[0], outbox_held_token=held[1], outbox_held_seconds=held[2]
        )
    by_address = postgresql.addressable(conn, table)
    statement = _claim_with_job_statement(table, limit, held is not None, by_address)
    rows = fetch_claimed(conn.execute(statement, params))
    if not rows:
        return LeasedClaim([], None, False)
    # The first row is the job's: see _claim_with_job_statement.
    job = rows[0]._mapping
    return LeasedClaim(rows[1:], int(job["id"]), job["created_at"] is not None)


@functools.cache
def _claim_with_job_statement(table: Table, limit: int, fenced: bool, by_address: bool) -> Any:
    # Built once per buffer, batch size and form, with bound parameters: building and hashing
    # a statement of four CTEs costs about as much as running it.
    #
    # One statement returns two kinds of rows: the claimed rows (``stamped``), and one row
    # for the batch job (``job``) in the buffer's columns: ``id`` carries the job's id,
    # ``group_id`` is NULL (a claimed row's never is, so the job's row sorts first), and
    # ``created_at`` is set when more rows wait, NULL otherwise; the other columns repeat a
    # claimed row's values (see ``sample``). Handlers get the claimed rows as they are; no
    # column is added to them.
    c = table.c
    gate = None
    if fenced:
        held = (
            update(_jobs)
            .where(
                _jobs.c.id == bindparam("outbox_held_id"),
                _jobs.c.lease_token == bindparam("outbox_held_token"),
            )
            .values(lease_expires_at=db_now_plus(bindparam("outbox_held_seconds", type_=Float)))
            .returning(_jobs.c.id)
            .cte("held")
        )
        gate = exists(select(held.c.id))
    stamped = (
        update(table)
        .where(postgresql.claimable(table, limit, by_address, only_if=gate))
        .values(group_id=bindparam("outbox_group_id", type_=c.group_id.type))
        .returning(*c)
        .cte("stamped")
    )
    values = batch_job_values(
        handler=bindparam("outbox_handler", type_=String),
        group_id=bindparam("outbox_group_id", type_=_jobs.c.group_id.type),
        priority=bindparam("outbox_priority", type_=Integer),
        attempts=0,
        run_at=db_now(),
        lease=(
            bindparam("outbox_owner", type_=String),
            bindparam("outbox_token", type_=_jobs.c.lease_token.type),
            bindparam("outbox_seconds", type_=Float),
        ),
    )
    # A SELECT takes SQL expressions: the plain values (kind, attempts) become literals.
    source = [
        value if isinstance(value, ColumnElement) else literal(value, _jobs.c[name].type)
        for name, value in values.items()
    ]
    job = (
        insert(_jobs)
        .from_select(list(values), select(*source).where(exists(select(stamped.c.id))))
        .returning(_jobs.c.id)
        .cte("job")
    )
    last_claimed = select(func.max(stamped.c.id)).scalar_subquery()
    more = case((unclaimed_after(table, last_claimed).is_not(None), db_now()))
    # The job's row carries one claimed row's values in the application's columns, not NULLs:
    # every row of the result passes through the columns' result processing (below), and a
    # TypeDecorator of a NOT NULL column may fail on a NULL it never otherwise meets. One row
    # of the materialized ``stamped``: a scan that stops at its first row.
    sample = select(*stamped.c).limit(1).subquery("sample")
    job_row = select(
        *(
            job.c.id.label(column.name)
            if column.name == "id"
            else more.label(column.name)
            if column.name == "created_at"
            else null().label(column.name)
            if column.name == "group_id"
            else sampled.label(column.name)
            for column, sampled in zip(c, sample.c, strict=True)
        )
    ).select_from(job.join(sample, true()))
    claimed = union_all(job_row, select(*stamped.c)).subquery("claimed")
    # A UNION's columns take their types from its first SELECT, where ``group_id`` is an
    # untyped NULL and ``id`` the job's: each column is read as the buffer declares it, as
    # ``select(*table.c)`` reads it, so that what a handler gets is typed as on every other
    # path (an Enum's member, a TypeDecorator's process_result_value, a PickleType unpickled).
    # The coercion renders no SQL of its own.
    typed = [type_coerce(claimed.c[column.name], column.type).label(column.name) for column in c]
    return select(*typed).order_by(claimed.c.group_id.is_not(None), claimed.c.id)


def unclaimed_after(table: Table, after: Any) -> Any:
    """The first unclaimed id past ``after``, NULL when there is none.

    An ordered probe of the partial index ``ix_<table>_unclaimed``: an EXISTS here is planned
    as a sequential scan, which steps over every dead and claimed row at the heap's start and
    grows slower as a drain goes on.
    """
    return (
        select(table.c.id)
        .where(table.c.group_id.is_(None), table.c.id > after)
        .order_by(table.c.id)
        .limit(1)
        .scalar_subquery()
    )


def finish_succeeded_group(
    conn: Connection,
    table: Table,
    *,
    job_id: int,
    token: uuid.UUID,
    group_id: uuid.UUID,
    archive: tuple[str, int] | None,
    lenient: bool = False,
) -> int | None:
    """PostgreSQL: delete a handled group's batch job, fenced by its lease, and its rows
    (archiving them as ``succeeded`` first when ``archive`` = (handler, attempts) is given),
    in one round trip. Returns how many rows were deleted, None when the lease was lost (then
    nothing changed).

    The CTE ``job`` deletes the job; ``outbox_row`` deletes the rows only if the job was ours,
    and returns them; ``archived`` writes what ``outbox_row`` returned, so the rows are read
    once.
    """
    params: dict[str, Any] = {
        "outbox_job_id": job_id,
        "outbox_token": token,
        "outbox_group_id": group_id,
    }
    if archive is not None:
        params.update(outbox_handler=archive[0], outbox_attempts=archive[1])
    stmt = _finish_succeeded_statement(table, archive is not None, lenient)
    held, deleted = conn.execute(stmt, params).one()
    return int(deleted) if held else None


@functools.cache
def _finish_succeeded_statement(table: Table, archive: bool, lenient: bool) -> Any:
    job = (
        delete(_jobs)
        .where(
            _jobs.c.id == bindparam("outbox_job_id"),
            _jobs.c.lease_token == bindparam("outbox_token"),
        )
        .returning(_jobs.c.id)
        .cte("job")
    )
    gone = (
        delete(table)
        .where(
            table.c.group_id == bindparam("outbox_group_id", type_=table.c.group_id.type),
            exists(select(job.c.id)),
        )
        # Only the archive reads the deleted rows' columns; a count needs none of them.
        .returning(*(table.c if archive else (table.c.id,)))
        .cte("outbox_row")
    )
    deleted = select(func.count()).select_from(gone).scalar_subquery()
    if archive:
        archived = (
            insert(_archive)
            .from_select(
                ARCHIVE_COLUMNS,
                archive_source(
                    postgresql.NAME,
                    table,
                    gone,
                    handler=bindparam("outbox_handler", type_=String),
                    status=schema.ArchiveStatus.SUCCEEDED,
                    attempts=bindparam("outbox_attempts", type_=Integer),
                    error=None,
                    lenient=lenient,
                ),
            )
            .returning(_archive.c.id)
            .cte("archived")
        )
        deleted = select(func.count()).select_from(archived).scalar_subquery()
    return select(exists(select(job.c.id)), deleted)
