"""Statements on buffer tables: counting, claiming, a group's rows, completing a group."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    String,
    Table,
    Text,
    and_,
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
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox import schema
from outbox._core.values import storage_type
from outbox._db import dialects
from outbox._db.dialects import postgresql
from outbox._db.dialects.clock import age_seconds, db_now, db_now_plus
from outbox._db.dialects.payload import byte_length
from outbox._db.queries.archive import ARCHIVE_COLUMNS, archive_source
from outbox._db.queries.jobs import batch_job_values
from outbox._db.types import LeasedClaim, UnreadableRowsError

_jobs = schema.jobs
_archive = schema.archive


def count_unclaimed(
    conn: Connection, table: Table, cap: int, only: ColumnElement[bool] | None = None
) -> int:
    """Unclaimed rows of a buffer, counting no further than ``cap``.

    A capped count: the subquery stops after ``cap`` rows of the partial index
    ``ix_<table>_unclaimed``, so a backlog of millions costs no more than the cap. ``only``:
    count only the rows that meet this condition too (those an ordered handler may claim).
    """
    # ORDER BY id keeps the planner on the partial index: a plain LIMIT lets it prefer a
    # sequential scan, which must step over every dead and claimed row at the heap's start.
    capped = (
        select(literal(1))
        .where(table.c.group_id.is_(None), true() if only is None else only)
        .order_by(table.c.id)
        .limit(cap)
        .subquery()
    )
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def oldest_unclaimed_age(conn: Connection, table: Table) -> float | None:
    """Seconds the oldest unclaimed event has waited; None when none waits.

    The lowest unclaimed id is the oldest: one step into the partial index
    ``ix_<table>_unclaimed``.
    """
    age = conn.execute(
        select(age_seconds(table.c.created_at))
        .where(table.c.group_id.is_(None))
        .order_by(table.c.id)
        .limit(1)
    ).scalar_one_or_none()
    return None if age is None else float(age)


def any_unclaimed(conn: Connection, table: Table, only: ColumnElement[bool] | None = None) -> bool:
    """Whether any row waits unclaimed (``only``: that meets this condition too): one probe of
    the partial index ``ix_<table>_unclaimed`` (ordered by id, so that the planner does not
    choose a sequential scan)."""
    probe = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(1)
    if only is not None:
        probe = probe.where(only)
    return conn.execute(probe).first() is not None


def all_of(*conditions: ColumnElement[bool] | None) -> ColumnElement[bool] | None:
    """The conditions given (None: no condition) together; None when there is none."""
    present = [condition for condition in conditions if condition is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else and_(*present)


NO_KEY = object()
"""The turn of the rows whose key is NULL, after the highest key (see :func:`next_key`)."""


def next_key(
    conn: Connection,
    table: Table,
    key_name: str,
    last: Any = None,
    only: ColumnElement[bool] | None = None,
) -> tuple[Any, ColumnElement[bool]] | None:
    """The key whose turn follows ``last`` among unclaimed rows (``only``: among those that
    meet this condition too), and the condition of its rows: keys in their order, then the
    rows with no key (:data:`NO_KEY`), then from the lowest key again. None when no row waits.
    ``last``: None before the first turn."""
    key = table.c[key_name]
    keyless = all_of(key.is_(None), only)
    if last is not NO_KEY:
        found, value = lowest_unclaimed_key(conn, table, key, above=last, only=only)
        if found:
            return value, key == _bound(key, value)
        if any_unclaimed(conn, table, keyless):
            return NO_KEY, key.is_(None)
    found, value = lowest_unclaimed_key(conn, table, key, only=only)
    if found:
        return value, key == _bound(key, value)
    if any_unclaimed(conn, table, keyless):
        return NO_KEY, key.is_(None)
    return None


def lowest_unclaimed_key(
    conn: Connection,
    table: Table,
    key: ColumnElement[Any],
    above: Any = None,
    only: ColumnElement[bool] | None = None,
) -> tuple[bool, Any]:
    """The lowest value of ``key`` among unclaimed rows (above ``above``, when given), NULL
    keys aside: (found, value). Served by an index on the key where the buffer has one."""
    stmt = select(key).where(table.c.group_id.is_(None), key.is_not(None)).order_by(key).limit(1)
    if above is not None:
        stmt = stmt.where(key > _bound(key, above))
    if only is not None:
        stmt = stmt.where(only)
    row = conn.execute(stmt).first()
    return (False, None) if row is None else (True, row[0])


def _bound(key: ColumnElement[Any], value: Any) -> ColumnElement[Any]:
    # A bound parameter of the key's type: SQLAlchemy would take a bare True or False for the
    # SQL constant, which a Boolean key compares with only by = and !=.
    return literal(value, key.type)


def claim_rows(
    conn: Connection,
    dialect: str,
    table: Table,
    group_id: uuid.UUID,
    limit: int,
    only: ColumnElement[bool] | None = None,
) -> int:
    """Stamp ``group_id`` on up to ``limit`` unclaimed rows, oldest first; returns how many.

    Each database claims its own way (``claim`` of its module in ``dialects``): PostgreSQL in
    one UPDATE whose locking CTE picks the rows ``FOR UPDATE SKIP LOCKED``; SQLite in one
    UPDATE under the write lock its transaction holds; MariaDB selects the ids ``FOR UPDATE
    SKIP LOCKED``, then updates them. Concurrent claimers take disjoint rows without waiting,
    and rows of uncommitted application transactions are never claimed. ``only``: claim only
    rows that meet this condition too (one key's, for keyed groups).
    """
    return dialects.statements(dialect).claim(conn, table, group_id, limit, only)


def claim_rows_returning(
    conn: Connection,
    dialect: str,
    table: Table,
    group_id: uuid.UUID,
    limit: int,
    only: ColumnElement[bool] | None = None,
) -> list[Any]:
    """:func:`claim_rows`, and the rows claimed, ordered by id, every column read as the table
    declares it: from the claim's own ``UPDATE ... RETURNING`` where the database has one, so
    that the group is not selected a second time.

    A value that cannot be read raises :class:`UnreadableRowsError` (see
    :func:`fetch_claimed`); the claim stands.
    """
    statements = dialects.statements(dialect)
    rows = fetch_claimed(statements.claim_returning(conn, table, group_id, limit, only))
    if rows:
        rows.sort(key=itemgetter(rows[0]._fields.index("id")))
    return rows


def claim_rows_sized(
    conn: Connection,
    dialect: str,
    table: Table,
    group_id: uuid.UUID,
    limit: int,
    max_bytes: int,
    only: ColumnElement[bool] | None = None,
) -> tuple[int, bool]:
    """Claim up to ``limit`` unclaimed rows, oldest first, no more of them than fit in
    ``max_bytes`` (:func:`event_bytes` each; the first row always goes, however large).
    Returns (rows claimed, whether the size cut the group short).

    The rows are picked with their sizes ``FOR UPDATE SKIP LOCKED`` (SQLite: under the write
    lock), the group cut where the running total would pass ``max_bytes``, and only those
    stamped; the rest stay unclaimed, their locks gone with the transaction.
    """
    pick = (
        select(table.c.id, event_bytes(table))
        .where(table.c.group_id.is_(None), true() if only is None else only)
        .order_by(table.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    picked = conn.execute(pick).all()
    taken: list[int] = []
    total = 0
    for event_id, size in picked:
        total += int(size or 0)
        if taken and total > max_bytes:
            break
        taken.append(event_id)
    if taken:
        conn.execute(update(table).where(table.c.id.in_(taken)).values(group_id=group_id))
    return len(taken), len(taken) < len(picked)


def event_bytes(table: Table) -> ColumnElement[int]:
    """An event's size: the bytes of its own columns' values as text (all but ``id``,
    ``group_id`` and ``created_at``), NULLs as nothing."""
    own = [c for c in table.c if c.name not in ("id", "group_id", "created_at")]
    sizes = [func.coalesce(byte_length(sql_cast(c, Text)), 0) for c in own]
    return functools.reduce(operator.add, sizes) if sizes else literal(0)


def fetch_claimed(result: Result[Any]) -> list[Any]:
    """The rows a claim returned, each value read as its column declares it.

    A value that cannot be read raises :class:`UnreadableRowsError` rather than undoing the
    claim: undone, the same oldest rows would be claimed and fail again, forever, and block
    every row behind them. A database error is not such a value, and goes on up as it is.
    """
    try:
        return list(result.all())
    except DBAPIError:
        raise
    except Exception as error:
        raise UnreadableRowsError(type(error).__name__) from error


def select_group_rows(
    conn: Connection, table: Table, group_id: uuid.UUID, limit: int | None = None
) -> list[Any]:
    """A group's rows (the first ``limit``), all columns in table order, by id; served by
    ``ix_<table>_group_id``."""
    return list(conn.execute(_group_rows(table, group_id).limit(limit)).all())


def select_claimed_rows(conn: Connection, table: Table, group_id: uuid.UUID) -> list[Any]:
    """:func:`select_group_rows` of a group being claimed: a value that cannot be read raises
    :class:`UnreadableRowsError` (see :func:`fetch_claimed`)."""
    return fetch_claimed(conn.execute(_group_rows(table, group_id)))


def _group_rows(table: Table, group_id: uuid.UUID) -> Any:
    return select(*table.c).where(table.c.group_id == group_id).order_by(table.c.id)


def count_group_rows(conn: Connection, table: Table, group_id: uuid.UUID) -> int:
    """How many rows a group has."""
    return int(conn.execute(select(func.count()).where(table.c.group_id == group_id)).scalar_one())


def unclaim_rows(
    conn: Connection, table: Table, group_id: uuid.UUID, event_ids: Iterable[int]
) -> int:
    """Take some rows out of their group, back to unclaimed (half of an ordered group being
    bisected)."""
    return conn.execute(
        update(table)
        .where(table.c.group_id == group_id, table.c.id.in_(list(event_ids)))
        .values(group_id=None)
    ).rowcount


def move_rows_to_group(
    conn: Connection,
    table: Table,
    group_id: uuid.UUID,
    new_group_id: uuid.UUID,
    event_ids: Iterable[int],
) -> int:
    """Move some rows of a group into a new group (events a handler asked to retry)."""
    return conn.execute(
        update(table)
        .where(table.c.group_id == group_id, table.c.id.in_(list(event_ids)))
        .values(group_id=new_group_id)
    ).rowcount


def delete_group_rows(
    conn: Connection,
    table: Table,
    group_id: uuid.UUID,
    event_ids: Iterable[int] | None = None,
    *,
    older_than: float | None = None,
) -> int:
    """Delete a group's rows: all, only ``event_ids``, or only those older than ``older_than``
    seconds. Served by ``ix_<table>_group_id``."""
    stmt = delete(table).where(table.c.group_id == group_id)
    if event_ids is not None:
        stmt = stmt.where(table.c.id.in_(list(event_ids)))
    if older_than is not None:
        stmt = stmt.where(table.c.created_at < db_now_plus(-older_than))
    return conn.execute(stmt).rowcount


def insert_events(
    conn: Connection | Session, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert event rows into a buffer with one executemany, in the caller's transaction."""
    if not rows:
        return 0
    conn.execute(insert(table), list(rows))
    return len(rows)


def insert_events_returning(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> list[int]:
    """Insert event rows into a buffer, keyed by column name; their ids in the order of
    ``rows`` (``INSERT ... RETURNING`` in one executemany, every row with the same columns)."""
    if not rows:
        return []
    # By name, not by ``table.c``'s keys: a column may have a key other than its name, and a
    # parameter named for no key would be dropped without a word.
    named = {column.name: column for column in table.columns}
    binds = {named[name]: bindparam(name, type_=named[name].type) for name in rows[0]}
    stmt = insert(table).values(binds).returning(table.c.id, sort_by_parameter_order=True)
    return [int(n) for n in conn.execute(stmt, list(rows)).scalars().all()]


def existing_ids(conn: Connection, table: Table, ids: Collection[int]) -> set[int]:
    """Of ``ids``, those a row of ``table`` has now (a replay's check that an event's own id
    is free); served by the primary key."""
    if not ids:
        return set()
    found = conn.execute(select(table.c.id).where(table.c.id.in_(sorted(ids)))).scalars()
    return {int(i) for i in found}


def events_by_id(conn: Connection, table: Table, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The rows of ``ids`` still in a buffer, each as its columns' values by name (served by
    the primary key)."""
    if not ids:
        return {}
    rows = conn.execute(select(table).where(table.c.id.in_(list(ids)))).mappings()
    return {int(row["id"]): {c.name: row[c] for c in table.columns} for row in rows}


def as_stored(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` as the database stores them (its rounding, lengths, time precision): inserted
    in a savepoint, read back and rolled back, so that nothing is written (a NOTIFY of a
    rolled-back savepoint is never sent). In the order of ``rows``."""
    with conn.begin_nested() as savepoint:
        ids = insert_events_returning(conn, table, rows)
        stored = events_by_id(conn, table, ids)
        savepoint.rollback()
    return [stored[n] for n in ids]


def insert_stored_rows(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> list[int]:
    """Insert rows of values as the database stores them (replayed from the archive), keyed by
    column name: each column bound as its storage type (:func:`outbox._core.values.storage_type`),
    so that no TypeDecorator converts a stored value a second time. One executemany per set of
    columns: payloads archived before a column was added lack it. Returns the rows' ids, in
    the order of ``rows`` (``INSERT ... RETURNING``: PostgreSQL, SQLite and MariaDB have it).
    Rows given their ``id`` keep it, and the id's counter is moved past them where the
    database does not (:meth:`~outbox._db.dialects.Statements.ids_written`)."""
    by_columns: dict[tuple[str, ...], list[int]] = {}
    for n, row in enumerate(rows):
        by_columns.setdefault(tuple(row), []).append(n)
    # By name, not by ``table.c``'s keys: a column may have a key other than its name.
    named = {column.name: column for column in table.columns}
    ids = [0] * len(rows)
    for names, positions in by_columns.items():
        binds = {
            named[name]: bindparam(name, type_=storage_type(named[name].type, conn.dialect))
            for name in names
        }
        stmt = insert(table).values(binds).returning(table.c.id, sort_by_parameter_order=True)
        new = conn.execute(stmt, [rows[n] for n in positions]).scalars().all()
        for n, new_id in zip(positions, new, strict=True):
            ids[n] = int(new_id)
    if any("id" in row for row in rows):
        statements = dialects.statements(dialects.name_of(conn.dialect))
        statements.ids_written(conn, table, max(ids))
    return ids


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
                    dialects.POSTGRESQL,
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


def count_buffer_rows(
    conn: Connection, table: Table, *, unclaimed: bool, cap: int | None = None
) -> int:
    """Rows of a buffer: the unclaimed ones, or the claimed ones (in groups); counting no
    further than ``cap`` when given (the partial index ``ix_<table>_unclaimed`` serves the
    unclaimed, ``ix_<table>_group_id`` the claimed)."""
    condition = table.c.group_id.is_(None) if unclaimed else table.c.group_id.is_not(None)
    if cap is None:
        return int(conn.execute(select(func.count()).where(condition)).scalar_one())
    # ORDER BY keeps the planner on the index (see count_unclaimed).
    order = table.c.id if unclaimed else table.c.group_id
    capped = select(literal(1)).where(condition).order_by(order).limit(cap).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def waiting_rows(
    conn: Connection | Session,
    table: Table,
    condition: ColumnElement[bool] | None,
    limit: int,
) -> tuple[int, list[Any]]:
    """Rows still in a buffer (unclaimed, or in a group not yet finished) that meet
    ``condition`` (all of them when None): how many, and the first ``limit`` of them by id.

    For the assertions of users' tests (``outbox.testing.assert_enqueued``), run in the
    caller's transaction so that its own unflushed-to-commit writes count: a full count, as a
    test's buffer is small.
    """
    where = true() if condition is None else condition
    count = conn.execute(select(func.count()).select_from(table).where(where)).scalar_one()
    rows = conn.execute(select(table).where(where).order_by(table.c.id).limit(limit)).all()
    return int(count), list(rows)


def oldest_event_age(conn: Connection, table: Table) -> float | None:
    """Seconds since the oldest event still in a buffer was written; None when it is empty.

    Ids grow with time, so the lowest id is the oldest event: one primary-key lookup.
    """
    age = conn.execute(
        select(age_seconds(table.c.created_at)).order_by(table.c.id).limit(1)
    ).scalar_one_or_none()
    return None if age is None else max(float(age), 0.0)
