"""Statements on buffer tables: counting, claiming, a group's rows, completing a group."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import CursorResult, Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox import schema
from outbox._core.values import storage_type
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.dialects.payload import byte_length
from outbox._db.types import UnreadableRowsError

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
    try:
        # A database that reads the rows before it stamps them (MariaDB) reads their values here.
        result = statements.claim_returning(conn, table, group_id, limit, only)
    except DBAPIError:
        raise
    except Exception as error:
        raise UnreadableRowsError(type(error).__name__) from error
    rows = fetch_claimed(result)
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


def copy_group_rows(
    conn: Connection,
    source: Table,
    target: Table,
    group_id: uuid.UUID,
    columns: Sequence[str],
    highest: int,
) -> int:
    """Copy a group's rows into another buffer, unclaimed, each under its own id: one
    ``INSERT ... SELECT`` of ``columns`` (names, the same in both tables); how many were
    copied. ``highest``: the group's highest id, past which the target's id counter is moved
    where the database does not move it itself (the target's own ids would collide with the
    copies' otherwise)."""
    picked = select(*(source.c[name] for name in columns)).where(source.c.group_id == group_id)
    copied = conn.execute(insert(target).from_select(list(columns), picked)).rowcount
    if copied:
        statements = dialects.statements(dialects.name_of(conn.dialect))
        statements.ids_written(conn, target, highest)
    return int(copied)


def insert_events(
    conn: Connection | Session, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert event rows into a buffer with one executemany, in the caller's transaction."""
    if not rows:
        return 0
    conn.execute(insert(table), list(rows))
    return len(rows)


def fold_events(
    conn: Connection | Session, table: Table, key: str, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Write each row over the unclaimed rows of its ``key`` column's value, or insert it when
    its key has none; in the caller's transaction, in the order given. How many were inserted.

    A row a claim is taking (locked by the claim's transaction) is waited for, then seen
    claimed: the event is inserted as a new row, never written into a group under way. Two
    writers of one key at once may both insert: the buffer then holds the key twice, each
    row with a whole state, which a coalescing handler folds again."""
    column = table.c[key]
    inserted = 0
    for row in rows:
        values = {k: v for k, v in row.items() if k not in ("id", "created_at")}
        fold = update(table).where(column == row[key], table.c.group_id.is_(None)).values(values)
        if cast(CursorResult[Any], conn.execute(fold)).rowcount == 0:
            conn.execute(insert(table), [dict(row)])
            inserted += 1
    return inserted


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


def count_buffer_rows(
    conn: Connection, table: Table, *, unclaimed: bool | None, cap: int | None = None
) -> int:
    """Rows of a buffer: the unclaimed ones, the claimed ones (in groups), or all of them
    (``unclaimed=None``); counting no further than ``cap`` when given (the partial index
    ``ix_<table>_unclaimed`` serves the unclaimed, ``ix_<table>_group_id`` the claimed, the
    primary key all)."""
    condition = (
        true()
        if unclaimed is None
        else table.c.group_id.is_(None)
        if unclaimed
        else table.c.group_id.is_not(None)
    )
    if cap is None:
        return int(
            conn.execute(select(func.count()).select_from(table).where(condition)).scalar_one()
        )
    # ORDER BY keeps the planner on the index (see count_unclaimed).
    order = table.c.group_id if unclaimed is False else table.c.id
    capped = (
        select(literal(1)).select_from(table).where(condition).order_by(order).limit(cap)
    ).subquery()
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
