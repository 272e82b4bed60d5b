"""PostgreSQL's one-round-trip statements on buffer tables: a claim job's claim with its batch
job (``Supports.one_statement_claim``), and a succeeded group's completion
(``Supports.one_statement_completion``). The callers ask ``supports`` first; every other
database runs the same steps as separate statements (``buffers``, ``jobs``)."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    String,
    Table,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.engine import CursorResult, Dialect, Row
from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._db import postgresql
from outbox._db.dialects.clock import db_now_plus
from outbox._db.queries.archive import ARCHIVE_COLUMNS, archive_source
from outbox._db.queries.buffers import fetch_claimed
from outbox._db.queries.jobs import batch_job_values
from outbox._db.types import LeasedClaim, TupleRows, UnreadableRowsError
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
    batch job, which is inserted only when rows were locked to be claimed.

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
    result = conn.execute(statement, params)
    # Each row ends with the job's id and the "more" flag (see _claim_with_job_statement):
    # read once from the driver's first row, which is then read again, without them, as the
    # buffer's columns.
    cursor = result.cursor
    try:
        first = cursor.fetchone()
    except DBAPIError:
        raise
    except Exception as error:
        raise UnreadableRowsError(type(error).__name__) from error
    if first is None:
        return LeasedClaim([], None, False)
    cursor.scroll(-1)
    job_id, more = first[-2], first[-1]
    width = len(table.c)
    rows: Sequence[Any]
    if _as_tuples(result, conn.dialect, table):
        rows = _claimed_tuples(result, table)
    else:
        rows = fetch_claimed(result.columns(*range(width)))
        # The rows come in the order of their addresses, nearly always the order of their ids.
        rows.sort(key=_by_id(table))
    return LeasedClaim(rows, int(job_id), bool(more))


def _as_tuples(result: CursorResult[Any], dialect: Dialect, table: Table) -> bool:
    """Whether the claim's rows may be read as the driver's tuples: no column type of the
    buffer processes the values psycopg returns (psycopg itself parses JSON, times, UUIDs and
    numbers; a TypeDecorator, or an Enum of a Python enum class, does process them), and no
    row is logged (``echo="debug"``)."""
    if getattr(result, "_row_logging_fn", None) is not None:
        return False
    description = result.cursor.description
    if description is None:
        return False
    return _unprocessed(dialect, table, tuple(d[1] for d in description[: len(table.c)]))


@functools.lru_cache(maxsize=256)
def _unprocessed(dialect: Dialect, table: Table, type_codes: tuple[Any, ...]) -> bool:
    # What SQLAlchemy asks of each column's type for a result (its dialect implementation's
    # processor for the driver's type code): None for every column means the result's rows
    # hold the driver's values as they are. A type that refuses the type code refuses it the
    # same way when the result reads the rows.
    try:
        return all(
            column.type.dialect_impl(dialect).result_processor(dialect, code) is None
            for column, code in zip(table.c, type_codes, strict=True)
        )
    except Exception:
        return False


def _claimed_tuples(result: CursorResult[Any], table: Table) -> TupleRows:
    """The claimed rows as psycopg's tuples, by id, each made a ``Row`` only when read as one,
    the same as the result's own (see :class:`TupleRows`)."""
    reduced = result.columns(*range(len(table.c)))
    # A Row's parent and index, as the reduced result's own rows have them.
    metadata = reduced._metadata
    key_to_index = metadata._key_to_index
    fields = tuple(reduced.keys())
    try:
        tuples: list[tuple[Any, ...]] = list(result.cursor.fetchall())
    except DBAPIError:
        raise
    except Exception as error:
        raise UnreadableRowsError(type(error).__name__) from error
    finally:
        result.close()
    # The rows come in the order of their addresses, nearly always the order of their ids.
    tuples.sort(key=_by_id(table))

    def make_row(values: tuple[Any, ...]) -> Any:
        return Row(metadata, None, key_to_index, values)

    return TupleRows(tuples, fields, make_row)


@functools.cache
def _by_id(table: Table) -> Any:
    return operator.itemgetter(list(table.c).index(table.c.id))


@functools.cache
def _claim_with_job_statement(table: Table, limit: int, fenced: bool, by_address: bool) -> Any:
    # Built once per buffer, batch size and form, with bound parameters: building and hashing
    # a statement of three CTEs costs about as much as running it.
    #
    # The claim's UPDATE is the statement itself, and its rows stream to the client as the
    # raw loop's do: a CTE of them (to add the job's row to them, or to sort them) would be
    # written to a tuplestore and read back, a fifth more of PostgreSQL's CPU per claim
    # (benchmarks/RESULTS.md). What the caller needs once, the job's id and whether more rows
    # wait, is computed once (an InitPlan each) and returned as two more columns of every row.
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
    locked = postgresql.claimable_rows(table, limit, by_address, only_if=gate)
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
    # The rows ``claimable`` locked are the rows the UPDATE stamps: a row locked by this
    # transaction cannot move before the UPDATE reaches it (``postgresql.claimable``).
    job = (
        insert(_jobs)
        .from_select(list(values), select(*source).where(exists(select(locked.c.id))))
        .returning(_jobs.c.id)
        .cte("job")
    )
    last_locked = select(func.max(locked.c.id)).scalar_subquery()
    more = unclaimed_after(table.alias("unclaimed"), last_locked).is_not(None)
    return (
        update(table)
        .where(postgresql.claimed_by(table, locked))
        .values(group_id=bindparam("outbox_group_id", type_=c.group_id.type))
        .returning(
            *c,
            select(job.c.id).scalar_subquery().label("outbox_job_id"),
            more.label("outbox_more"),
        )
    )


def unclaimed_after(table: Any, after: Any) -> Any:
    """The first unclaimed id of ``table`` (a buffer or an alias of one) past ``after``, NULL
    when there is none.

    An ordered probe of the partial index ``ix_<table>_unclaimed``: an EXISTS here is planned
    as a sequential scan, which steps over every dead and claimed row at the heap's start and
    grows slower as a drain goes on.
    """
    return (
        select(table.c.id)
        .where(table.c.group_id.is_(None), table.c.id > after)
        .order_by(table.c.id)
        .limit(literal_column("1"))  # a literal, as the claim's own limit
        .scalar_subquery()
    )


def finish_succeeded_group(
    conn: Connection,
    table: Table,
    *,
    job_id: int,
    token: uuid.UUID,
    group_id: uuid.UUID,
    size: int,
    archive: tuple[str, int] | None,
    lenient: bool = False,
) -> int | None:
    """PostgreSQL: delete a handled group's batch job, fenced by its lease, and its rows
    (archiving them as ``succeeded`` first when ``archive`` = (handler, attempts) is given),
    in one round trip. Returns how many events succeeded (``size``, the events handed over,
    or with an archive how many it archived), None when the lease was lost (then nothing
    changed).

    With an archive, the CTE ``job`` deletes the job; ``outbox_row`` deletes the rows only if
    the job was ours, and returns them; ``archived`` writes what ``outbox_row`` returned, so the
    rows are read once. Without one, nothing of the rows is returned (returning them, even only
    their ids to count, cost PostgreSQL half as much again as the delete): the rows' delete is
    a CTE, and the statement the job's delete, whose row count says whether it was ours.
    """
    params: dict[str, Any] = {
        "outbox_job_id": job_id,
        "outbox_token": token,
        "outbox_group_id": group_id,
    }
    if archive is None:
        held = conn.execute(_delete_succeeded_statement(table), params).rowcount == 1
        return size if held else None
    params.update(outbox_handler=archive[0], outbox_attempts=archive[1])
    stmt = _finish_succeeded_statement(table, True, lenient)
    held, deleted = conn.execute(stmt, params).one()
    return int(deleted) if held else None


def _job_deleted() -> Any:
    """The CTE ``job``: the batch job deleted, fenced by its lease."""
    return (
        delete(_jobs)
        .where(
            _jobs.c.id == bindparam("outbox_job_id"),
            _jobs.c.lease_token == bindparam("outbox_token"),
        )
        .returning(_jobs.c.id)
        .cte("job")
    )


@functools.cache
def _delete_succeeded_statement(table: Table) -> Any:
    # The rows go only while the job is ours in the statement's snapshot; the job's own delete
    # then takes its row lock, and finds it no longer ours if a rescue changed it since, when
    # the caller rolls the whole statement back (a lost lease).
    ours = (
        _jobs.c.id == bindparam("outbox_job_id"),
        _jobs.c.lease_token == bindparam("outbox_token"),
    )
    gone = (
        delete(table)
        .where(
            table.c.group_id == bindparam("outbox_group_id", type_=table.c.group_id.type),
            exists().where(*ours),
        )
        .cte("outbox_row")
    )
    return delete(_jobs).where(*ours).add_cte(gone)


@functools.cache
def _finish_succeeded_statement(table: Table, archive: bool, lenient: bool) -> Any:
    job = _job_deleted()
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
