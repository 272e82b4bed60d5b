"""Every SQL statement outbox issues, one function each.

Each function takes an open ``Connection`` (the caller owns the transaction) and the outbox
dialect name where statements differ. Hot statements carry a comment on why they are shaped the
way they are: which lock they take and which index serves them.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    String,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    text,
    true,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.engine import Engine, Result
from sqlalchemy.exc import CompileError, DBAPIError
from sqlalchemy.orm import Session

from outbox import _dialects as dialects
from outbox import schema
from outbox._dialects import age_seconds, db_now, db_now_plus

_jobs = schema.jobs
_archive = schema.archive
_workers = schema.workers


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job as a worker holds it after acquiring it."""

    id: int
    kind: str
    handler: str
    slot: int | None
    group_id: uuid.UUID | None
    priority: int
    attempts: int
    lease_token: uuid.UUID
    last_error: str | None


# --- distributor ---------------------------------------------------------------------------


def count_unclaimed(conn: Connection, table: Table, cap: int) -> int:
    """Unclaimed rows of a buffer, counting no further than ``cap``.

    A capped count: the subquery stops after ``cap`` rows of the partial index
    ``ix_<table>_unclaimed``, so a backlog of millions costs no more than the cap.
    """
    # ORDER BY id keeps the planner on the partial index: a plain LIMIT lets it prefer a
    # sequential scan, which must step over every dead and claimed row at the heap's start.
    capped = (
        select(literal(1))
        .where(table.c.group_id.is_(None))
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


def any_unclaimed(conn: Connection, table: Table) -> bool:
    """Whether any row waits unclaimed: one probe of the partial index ``ix_<table>_unclaimed``
    (ordered by id, so that the planner does not choose a sequential scan)."""
    probe = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(1)
    return conn.execute(probe).first() is not None


def claim_job_slots(conn: Connection, handler: str) -> set[int]:
    """The slots of a handler's claim jobs, pending or running."""
    rows = conn.execute(
        select(_jobs.c.slot).where(_jobs.c.handler == handler, _jobs.c.kind == schema.JobKind.CLAIM)
    )
    return {int(slot) for (slot,) in rows}


def insert_claim_jobs(
    conn: Connection, dialect: str, handler: str, slots: Sequence[int], priority: int
) -> int:
    """Enqueue claim jobs in the given slots; a slot already taken is skipped, not duplicated.

    The unique index ``uq_outbox_jobs_claim_slot`` is what makes overlapping distributors safe:
    both pick the lowest free slots, and the second insert of a slot does nothing.
    """
    if not slots:
        return 0
    stmt = dialects.insert_ignore(dialect, _jobs)
    rows = [
        {"kind": schema.JobKind.CLAIM, "handler": handler, "slot": s, "priority": priority}
        for s in slots
    ]
    if dialect == dialects.POSTGRESQL:
        # One statement for all slots; RETURNING counts exactly the rows inserted.
        return len(conn.execute(stmt.values(rows).returning(_jobs.c.id)).all())
    # One statement per slot: a multi-row insert-ignore reports an unreliable rowcount.
    stmt = stmt.execution_options(preserve_rowcount=True)
    return sum(max(conn.execute(stmt, row).rowcount, 0) for row in rows)


# --- worker: acquiring, extending and rescuing leases ---------------------------------------


def acquire_jobs(
    conn: Connection,
    dialect: str,
    *,
    handlers: Sequence[str],
    worker_id: str,
    token: uuid.UUID,
    limit: int,
    lease_seconds: float,
    batch_handlers: Sequence[str] | None = None,
    kind: str | None = None,
) -> list[JobRow]:
    """Lease up to ``limit`` due jobs, most urgent band first, then the longest due.

    Served by the partial index ``ix_outbox_jobs_ready (priority, run_at, id) WHERE lease_token
    IS NULL``. PostgreSQL and MariaDB lock the picked rows with ``FOR UPDATE SKIP LOCKED`` so
    that concurrent workers take disjoint jobs without waiting; the pick is a CTE because a
    ``WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` subquery may be run more than
    once by PostgreSQL and lease more than ``n`` jobs. SQLite has no row locks: the write lock
    taken by ``BEGIN IMMEDIATE`` makes the whole transaction exclusive.

    ``batch_handlers``: when given, batch jobs only of these handlers (claim jobs of all);
    handlers with a fleet-wide concurrency cap are leased apart, by
    :func:`acquire_capped_batch_jobs`.
    """
    kinds: Any = _jobs.c.handler.in_(handlers)
    if kind is not None:
        kinds = kinds & (_jobs.c.kind == kind)
    if batch_handlers is not None:
        kinds = kinds & (
            (_jobs.c.kind == schema.JobKind.CLAIM) | _jobs.c.handler.in_(batch_handlers)
        )
    pick = (
        select(_jobs.c.id)
        .where(_jobs.c.lease_token.is_(None), _jobs.c.run_at <= db_now(), kinds)
        .order_by(_jobs.c.priority, _jobs.c.run_at, _jobs.c.id)
        .limit(limit)
    )
    values = {
        "lease_owner": worker_id,
        "lease_token": token,
        "lease_expires_at": db_now_plus(lease_seconds),
        "attempts": _jobs.c.attempts + 1,
    }
    columns = (
        _jobs.c.id,
        _jobs.c.kind,
        _jobs.c.handler,
        _jobs.c.slot,
        _jobs.c.group_id,
        _jobs.c.priority,
        _jobs.c.attempts,
        _jobs.c.lease_token,
        _jobs.c.last_error,
    )
    if dialect == dialects.POSTGRESQL:
        picked = pick.with_for_update(skip_locked=True).cte("picked")
        rows = conn.execute(
            update(_jobs).where(_jobs.c.id == picked.c.id).values(values).returning(*columns)
        )
    elif dialect == dialects.SQLITE:
        rows = conn.execute(
            update(_jobs)
            .where(_jobs.c.id.in_(pick.scalar_subquery()))
            .values(values)
            .returning(*columns)
        )
    else:
        # The ready index in the order it is scanned: on a job table as small as outbox keeps
        # it, MariaDB would rather scan it whole and sort, locking every due job before the
        # LIMIT, and a second worker's acquisition would find none of them free.
        ordered = pick.with_hint(_jobs, "FORCE INDEX (ix_outbox_jobs_ready)", "mysql")
        ids = list(conn.execute(ordered.with_for_update(skip_locked=True)).scalars())
        if not ids:
            return []
        conn.execute(update(_jobs).where(_jobs.c.id.in_(ids)).values(values))
        rows = conn.execute(
            select(*columns).where(_jobs.c.id.in_(ids), _jobs.c.lease_token == token)
        )
    jobs = [JobRow(**row._mapping) for row in rows]
    return sorted(jobs, key=lambda j: (j.priority, j.id))


def acquire_capped_batch_jobs(
    conn: Connection,
    dialect: str,
    *,
    handler: str,
    cap: int,
    worker_id: str,
    token: uuid.UUID,
    limit: int,
    lease_seconds: float,
) -> list[JobRow]:
    """Lease batch jobs of a handler with a fleet-wide cap on groups in flight.

    Count-then-lease is only exact when no other worker does the same at once, so the
    transaction first takes a per-handler lock: ``pg_advisory_xact_lock`` on PostgreSQL
    (released at commit), the database write lock on SQLite (BEGIN IMMEDIATE). MariaDB has no
    lock that ends with the transaction but row locks: the count locks every batch job of the
    handler (``FOR UPDATE``, through ``uq_outbox_jobs_claim_slot``'s leading ``handler``), so a
    second worker's count waits for the first one's leases to commit and then sees them.
    """
    mine = (_jobs.c.handler == handler, _jobs.c.kind == schema.JobKind.BATCH)
    # In flight: leased, and not refused (a refused group runs nowhere).
    in_flight = _jobs.c.lease_expires_at.is_not(None)
    if dialect == dialects.POSTGRESQL:
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"outbox:{handler}"))))
    if dialect == dialects.MYSQL:
        leased = conn.execute(select(in_flight).where(*mine).with_for_update()).scalars()
        running = sum(1 for is_leased in leased if is_leased)
    else:
        running = conn.execute(select(func.count()).where(*mine, in_flight)).scalar_one()
    room = min(cap - int(running), limit)
    if room <= 0:
        return []
    return acquire_jobs(
        conn,
        dialect,
        handlers=[handler],
        batch_handlers=[handler],
        worker_id=worker_id,
        token=token,
        limit=room,
        lease_seconds=lease_seconds,
        kind=schema.JobKind.BATCH,
    )


def extend_leases(
    conn: Connection, worker_id: str, job_ids: Sequence[int], lease_seconds: float
) -> int:
    """Push back the leases of the jobs a worker is running now; returns how many.

    Only those: a job whose finishing write failed (the database was down longer than its
    patience) is no longer running, and its lease must run out so that it is rescued.
    """
    if not job_ids:
        return 0
    return conn.execute(
        update(_jobs)
        .where(_jobs.c.lease_owner == worker_id, _jobs.c.id.in_(list(job_ids)))
        .values(lease_expires_at=db_now_plus(lease_seconds))
    ).rowcount


# What a rescued job's last_error says: its attempt was interrupted, not failed by the handler.
RESCUED_ERROR = "lease expired: its worker stopped before finishing"


def extend_lease(conn: Connection, job_id: int, token: uuid.UUID, lease_seconds: float) -> bool:
    """Push back one job's lease; False when it is no longer ours (the fence)."""
    return (
        conn.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id, _jobs.c.lease_token == token)
            .values(lease_expires_at=db_now_plus(lease_seconds))
        ).rowcount
        == 1
    )


def rescue_expired_jobs(conn: Connection, dialect: str) -> int:
    """Free the jobs whose lease ran out (their worker died or stalled) for another worker.

    The attempt the dead worker started stays counted. A worker that comes back later finds
    its token gone, so each of its finishing writes changes nothing. Rows locked by a
    completion in progress are skipped, not waited for (``FOR UPDATE SKIP LOCKED``): a job
    being finished is not abandoned, and a frozen worker's open transaction must not stall the
    rescue of everyone else.
    """
    expired = select(_jobs.c.id).where(
        _jobs.c.lease_token.is_not(None), _jobs.c.lease_expires_at < db_now()
    )
    if dialects.uses_skip_locked(dialect):
        if dialect == dialects.POSTGRESQL:
            picked = expired.with_for_update(skip_locked=True).cte("expired")
            condition: Any = _jobs.c.id == picked.c.id
        else:
            ids = list(conn.execute(expired.with_for_update(skip_locked=True)).scalars())
            if not ids:
                return 0
            condition = _jobs.c.id.in_(ids)
    else:
        condition = _jobs.c.id.in_(expired.scalar_subquery())
    return conn.execute(
        update(_jobs)
        .where(condition, _jobs.c.lease_token.is_not(None))
        .values(
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            run_at=db_now(),
            last_error=RESCUED_ERROR,
        )
    ).rowcount


# --- finishing a job, fenced by its lease ----------------------------------------------------


def delete_job(conn: Connection, job_id: int, token: uuid.UUID) -> bool:
    """Delete a finished job; False when its lease is no longer ours (the fence)."""
    result = conn.execute(delete(_jobs).where(_jobs.c.id == job_id, _jobs.c.lease_token == token))
    return result.rowcount == 1


# A job held with no expiry (``lease_token`` set, ``lease_expires_at`` NULL) is *refused*: the
# database refused its group's finishing write for good. Acquisition takes only jobs with no
# token and rescue only expired leases, so it stays until an operator releases it.
def _refused() -> ColumnElement[bool]:
    return and_(_jobs.c.lease_token.is_not(None), _jobs.c.lease_expires_at.is_(None))


def hold_refused_job(conn: Connection, job_id: int, token: uuid.UUID, error: str) -> bool:
    """Hold a leased job as refused, with why; False when its lease is no longer ours."""
    result = conn.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.lease_token == token)
        .values(lease_owner=None, lease_expires_at=None, last_error=error)
    )
    return result.rowcount == 1


@dataclass(frozen=True)
class RefusedGroup:
    """A group whose finishing write the database refused."""

    handler: str
    group_id: uuid.UUID
    attempts: int
    error: str | None


def refused_groups(conn: Connection, handler: str | None = None) -> list[RefusedGroup]:
    """The refused groups (of one handler), oldest job first."""
    stmt = select(_jobs.c.handler, _jobs.c.group_id, _jobs.c.attempts, _jobs.c.last_error).where(
        _refused(), _jobs.c.kind == schema.JobKind.BATCH
    )
    if handler is not None:
        stmt = stmt.where(_jobs.c.handler == handler)
    return [RefusedGroup(*row) for row in conn.execute(stmt.order_by(_jobs.c.id))]


def release_refused_jobs(
    conn: Connection, handler: str | None = None, group_id: uuid.UUID | None = None
) -> int:
    """Give refused groups' jobs back to run again now (all, one handler's, or one group's);
    returns how many. Their attempts stay counted."""
    stmt = update(_jobs).where(_refused(), _jobs.c.kind == schema.JobKind.BATCH)
    if handler is not None:
        stmt = stmt.where(_jobs.c.handler == handler)
    if group_id is not None:
        stmt = stmt.where(_jobs.c.group_id == group_id)
    return conn.execute(stmt.values(lease_token=None, run_at=db_now())).rowcount


def delete_pending_claim_jobs(conn: Connection, handler: str) -> int:
    """Delete a handler's claim jobs that wait to run (none is leased): for when a claim found
    its buffer drained. They were counted for rows that others have claimed since; each would
    cost a worker a transaction to find nothing. The next distribution enqueues what new rows
    need."""
    return conn.execute(
        delete(_jobs).where(
            _jobs.c.handler == handler,
            _jobs.c.kind == schema.JobKind.CLAIM,
            _jobs.c.lease_token.is_(None),
        )
    ).rowcount


def release_job(
    conn: Connection,
    job_id: int,
    token: uuid.UUID,
    *,
    delay_seconds: float,
    error: str | None,
) -> bool:
    """Give a job back to run again after ``delay_seconds``; False when the lease was lost."""
    result = conn.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.lease_token == token)
        .values(
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            run_at=db_now_plus(delay_seconds),
            last_error=error,
        )
    )
    return result.rowcount == 1


def return_job(conn: Connection, job_id: int, token: uuid.UUID) -> bool:
    """Give back a leased job that could not start, as if it had not been leased: its attempt
    is not counted and its last error stays. False when the lease was lost."""
    result = conn.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.lease_token == token)
        .values(
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            attempts=_jobs.c.attempts - 1,
        )
    )
    return result.rowcount == 1


def insert_batch_job(
    conn: Connection,
    *,
    handler: str,
    group_id: uuid.UUID,
    priority: int,
    attempts: int = 0,
    delay_seconds: float = 0.0,
    error: str | None = None,
    lease: tuple[str, uuid.UUID, float] | None = None,
) -> int:
    """Enqueue the batch job of a freshly claimed (or split off) group; returns its id.

    ``lease``: (worker id, token, seconds) to create the job already leased, as its first
    attempt, by the worker that claimed the group and will handle it at once.
    """
    values = _batch_job_values(
        handler=handler,
        group_id=group_id,
        priority=priority,
        attempts=attempts,
        run_at=db_now_plus(delay_seconds),
        lease=lease,
    )
    values["last_error"] = error
    result = conn.execute(insert(_jobs).values(values))
    return int(result.inserted_primary_key[0])  # type: ignore[index]


def _batch_job_values(
    *, handler: Any, group_id: Any, priority: Any, attempts: int, run_at: Any, lease: Any
) -> dict[str, Any]:
    """The columns of a new batch job, as values or SQL expressions; ``lease``: (worker id,
    token, seconds) to create it leased, its first attempt counted."""
    values: dict[str, Any] = {
        "kind": schema.JobKind.BATCH,
        "handler": handler,
        "group_id": group_id,
        "priority": priority,
        "attempts": attempts,
        "run_at": run_at,
    }
    if lease is not None:
        owner, token, seconds = lease
        values.update(
            lease_owner=owner,
            lease_token=token,
            lease_expires_at=db_now_plus(seconds),
            attempts=attempts + 1,
        )
    return values


# --- buffer tables ---------------------------------------------------------------------------


def claim_rows(
    conn: Connection, dialect: str, table: Table, group_id: uuid.UUID, limit: int
) -> int:
    """Stamp ``group_id`` on up to ``limit`` unclaimed rows, oldest first; returns how many.

    PostgreSQL: a locking CTE, ``WITH c AS (SELECT ctid ... WHERE group_id IS NULL ORDER BY id
    LIMIT n FOR UPDATE SKIP LOCKED) UPDATE ... WHERE ctid = ANY(ARRAY(SELECT ctid FROM c))``.
    The CTE runs exactly once, so at most ``n`` rows are claimed; the ``IN (SELECT ... LIMIT n
    FOR UPDATE SKIP LOCKED)`` form may be re-run by the planner and claim more. The rows are
    updated where the CTE locked them, by their physical address (one TID scan), rather than
    looked up again in the primary key (see :func:`_locked`). SKIP LOCKED lets concurrent
    claimers take disjoint rows without waiting, and rows of uncommitted application
    transactions are invisible, so a claim neither blocks the application nor sees its rows
    early. The partial index ``ix_<table>_unclaimed`` serves the ordered scan.
    SQLite: the transaction holds the database's write lock (BEGIN IMMEDIATE), so a plain
    ``IN (SELECT ... LIMIT n)`` is safe. MariaDB: no LIMIT inside IN, no UPDATE ... RETURNING:
    select the ids with SKIP LOCKED, then update by id.
    """
    stmt = claim_update(dialect, table, group_id, limit, by_address=addressable(conn, table))
    if stmt is not None:
        return conn.execute(stmt).rowcount
    pick = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(limit)
    ids = list(conn.execute(pick.with_for_update(skip_locked=True)).scalars())
    if not ids:
        return 0
    return conn.execute(update(table).where(table.c.id.in_(ids)).values(group_id=group_id)).rowcount


def claim_update(
    dialect: str, table: Table, group_id: uuid.UUID, limit: int, *, by_address: bool
) -> Update | None:
    """The claim of :func:`claim_rows` as one UPDATE (PostgreSQL, SQLite), None on MariaDB.

    A caller may add ``.returning(*claimed_columns(...))`` to get the claimed rows back from
    the same statement instead of selecting them again. ``by_address``: what
    :func:`addressable` says of the table (PostgreSQL).
    """
    if dialect == dialects.POSTGRESQL:
        return update(table).where(_locked(table, limit, by_address)).values(group_id=group_id)
    pick = select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id).limit(limit)
    if dialect == dialects.SQLITE:
        return update(table).where(table.c.id.in_(pick.scalar_subquery())).values(group_id=group_id)
    return None


class UnreadableRowsError(Exception):
    """Rows were claimed, but one of their stored values could not be turned into Python: by
    the driver, or by its column's type (an Enum member since removed, a TypeDecorator's
    ``process_result_value`` that raises). The claim itself stands."""


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


def claimed_columns(dialect: str, table: Table) -> list[ColumnElement[Any]]:
    """What a claim's ``UPDATE ... RETURNING`` returns: every column of ``table``, in table
    order, each to be read as the table declares it.

    SQLite stores a whole number in a column of REAL affinity (FLOAT, REAL, DOUBLE) as an
    integer, and RETURNING hands it back as one where a SELECT gives the REAL: such a column
    is returned through ``CAST(... AS REAL)``, taken only for its REAL values (other values
    stay as stored, as a SELECT returns them).
    """
    if dialect != dialects.SQLITE:
        return list(table.c)
    return list(_sqlite_claimed_columns(table))


@functools.cache
def _sqlite_claimed_columns(table: Table) -> tuple[ColumnElement[Any], ...]:
    # Built once per buffer: deciding affinities compiles every column's type.
    return tuple(_as_real(column) if _real_affinity(column) else column for column in table.c)


def _real_affinity(column: Any) -> bool:
    # SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1), in their order.
    try:
        declared = column.type.compile(dialect=dialects.default_dialect(dialects.SQLITE)).upper()
    except CompileError:  # a type SQLite cannot name: no SQLite table has such a column
        return False
    if "INT" in declared or any(word in declared for word in ("CHAR", "CLOB", "TEXT", "BLOB")):
        return False
    return any(word in declared for word in ("REAL", "FLOA", "DOUB"))


def _as_real(column: Any) -> ColumnElement[Any]:
    real = case((func.typeof(column) == "real", sql_cast(column, Float)), else_=column)
    return type_coerce(real, column.type).label(column.name)


def addressable(conn: Connection, table: Table) -> bool:
    """Whether a claim may address ``table``'s rows by ``ctid``: on PostgreSQL, unless the
    table is partitioned (a ``ctid`` is unique only within one partition). Asked once per
    engine and table."""
    if conn.dialect.name != dialects.POSTGRESQL:
        return True
    known = _ADDRESSABLE.setdefault(conn.engine, {})
    if table.fullname not in known:
        name = conn.dialect.identifier_preparer.format_table(table)
        kind = conn.execute(
            text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)"), {"name": name}
        ).scalar()
        known[table.fullname] = kind != "p"
    return known[table.fullname]


_ADDRESSABLE: weakref.WeakKeyDictionary[Engine, dict[str, bool]] = weakref.WeakKeyDictionary()


def _locked(
    table: Table, limit: int, by_address: bool, *, only_if: Any = None
) -> ColumnElement[bool]:
    """PostgreSQL: the claim's condition. The CTE ``claimable`` locks up to ``limit``
    unclaimed rows, oldest first, skipping locked ones (``only_if``: an extra condition of the
    pick); the UPDATE takes them by address, ``ctid = ANY(ARRAY(SELECT ctid FROM claimable))``,
    or, where the table is not :func:`addressable`, by id, ``id IN (SELECT id FROM claimable)``.

    A row locked by this transaction cannot move before the UPDATE reaches it, so its ``ctid``
    from the CTE still addresses it: the UPDATE fetches all the rows in one TID scan instead of
    a primary-key lookup per row (PostgreSQL's CPU per drain fell by a quarter,
    benchmarks/README.md). Should a row have moved anyway, the TID scan would find no current
    row at the old address and leave it unclaimed for the next claim: never claimed twice,
    never lost.
    """
    # Unqualified ``ctid``: the pick and the UPDATE each have the buffer as their only table.
    key = literal_column("ctid") if by_address else table.c.id
    pick = select(key).where(table.c.group_id.is_(None))
    if only_if is not None:
        pick = pick.where(only_if)
    claimable = (
        pick.order_by(table.c.id).limit(limit).with_for_update(skip_locked=True).cte("claimable")
    )
    if by_address:
        return key == any_(func.array(select(claimable.c.ctid).scalar_subquery()))
    return table.c.id.in_(select(claimable.c.id))


def select_group_rows(conn: Connection, table: Table, group_id: uuid.UUID) -> list[Any]:
    """A group's rows, all columns in table order, by id; served by ``ix_<table>_group_id``."""
    return list(conn.execute(_group_rows(table, group_id)).all())


def select_claimed_rows(conn: Connection, table: Table, group_id: uuid.UUID) -> list[Any]:
    """:func:`select_group_rows` of a group being claimed: a value that cannot be read raises
    :class:`UnreadableRowsError` (see :func:`fetch_claimed`)."""
    return fetch_claimed(conn.execute(_group_rows(table, group_id)))


def _group_rows(table: Table, group_id: uuid.UUID) -> Any:
    return select(*table.c).where(table.c.group_id == group_id).order_by(table.c.id)


def count_group_rows(conn: Connection, table: Table, group_id: uuid.UUID) -> int:
    """How many rows a group has."""
    return int(conn.execute(select(func.count()).where(table.c.group_id == group_id)).scalar_one())


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


# What an archive row is made of, in the order :func:`_archive_source` selects it.
_ARCHIVE_COLUMNS = (
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


def _archive_source(
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
    for ``INSERT INTO outbox_archive (_ARCHIVE_COLUMNS) SELECT ...``; ``handler`` and
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
    source = _archive_source(
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
    stmt = insert(_archive).from_select(_ARCHIVE_COLUMNS, source)
    # SQLAlchemy keeps the rowcount of INSERTs only when asked to.
    return conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount


def insert_events(
    conn: Connection | Session, table: Table, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert event rows into a buffer with one executemany, in the caller's transaction."""
    if not rows:
        return 0
    conn.execute(insert(table), list(rows))
    return len(rows)


def insert_stored_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert rows of values as the database stores them (replayed from the archive), keyed by
    column name: each column bound as its storage type (:func:`outbox._dialects.storage_type`),
    so that no TypeDecorator converts a stored value a second time. One executemany per set of
    columns: payloads archived before a column was added lack it."""
    by_columns: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        by_columns.setdefault(tuple(row), []).append(row)
    # By name, not by ``table.c``'s keys: a column may have a key other than its name.
    named = {column.name: column for column in table.columns}
    for names, same_columns in by_columns.items():
        binds = {
            named[name]: bindparam(
                name, type_=dialects.storage_type(named[name].type, conn.dialect)
            )
            for name in names
        }
        conn.execute(insert(table).values(binds), same_columns)
    return len(rows)


# --- the hot path on PostgreSQL: a group claimed, and finished, in one statement each --------


@dataclass(frozen=True, slots=True)
class LeasedClaim:
    """A group claimed on PostgreSQL together with its leased batch job."""

    rows: list[Any]
    """The claimed rows, all columns in table order, by id; empty when nothing was claimed."""
    job_id: int | None
    """The group's batch job; None when nothing was claimed."""
    more: bool
    """Unclaimed rows remained past the last claimed id (a hint; see below)."""


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
    statement = _claim_with_job_statement(table, limit, held is not None, addressable(conn, table))
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
        .where(_locked(table, limit, by_address, only_if=gate))
        .values(group_id=bindparam("outbox_group_id", type_=c.group_id.type))
        .returning(*c)
        .cte("stamped")
    )
    values = _batch_job_values(
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


def batch_job_of_group(conn: Connection, group_id: uuid.UUID) -> int | None:
    """The id of a group's batch job, if it has one."""
    stmt = select(_jobs.c.id).where(
        _jobs.c.group_id == group_id, _jobs.c.kind == schema.JobKind.BATCH
    )
    found = conn.execute(stmt).scalar_one_or_none()
    return None if found is None else int(found)


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
                _ARCHIVE_COLUMNS,
                _archive_source(
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


# --- index maintenance (PostgreSQL) -----------------------------------------------------------

# What an interrupted REINDEX CONCURRENTLY leaves: the new index it was building, or the old one
# it had swapped out, both invalid.
_REINDEX_LEFTOVER = r"_cc(new|old)[0-9]*$"


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """An index of a buffer table, as ``outbox reindex`` sees it."""

    name: str
    bytes: int
    leftover: bool
    """An invalid index left by an interrupted ``REINDEX ... CONCURRENTLY``."""


def _qualified(conn: Connection, table: Table, name: str | None = None) -> str:
    """The quoted name of ``table``, or of its index ``name`` (in the table's schema)."""
    preparer = conn.dialect.identifier_preparer
    if name is None:
        return preparer.format_table(table)
    prefix = f"{preparer.quote_schema(table.schema)}." if table.schema else ""
    return prefix + preparer.quote(name)


def analyze(conn: Connection, table: Table) -> None:
    """Refresh the planner's statistics of a table, its row count among them."""
    conn.exec_driver_sql(f"ANALYZE {_qualified(conn, table)}")


def estimated_rows(conn: Connection, table: Table) -> float:
    """The table's row count as its statistics have it (0 when never analysed)."""
    stmt = text("SELECT reltuples FROM pg_class WHERE oid = CAST(:name AS regclass)")
    found = conn.execute(stmt, {"name": _qualified(conn, table)}).scalar_one()
    return max(float(found), 0.0)


def table_indexes(conn: Connection, table: Table) -> list[IndexInfo]:
    """Every index of a table with its size on disk, by name."""
    stmt = text(
        "SELECT c.relname, pg_relation_size(i.indexrelid),"
        " NOT i.indisvalid AND c.relname ~ :leftover"
        " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = CAST(:name AS regclass) ORDER BY c.relname"
    )
    params = {"name": _qualified(conn, table), "leftover": _REINDEX_LEFTOVER}
    return [
        IndexInfo(name, int(size), bool(leftover))
        for name, size, leftover in conn.execute(stmt, params)
    ]


def index_bytes(conn: Connection, table: Table, name: str) -> int:
    """The size of one index on disk."""
    stmt = text("SELECT pg_relation_size(CAST(:name AS regclass))")
    return int(conn.execute(stmt, {"name": _qualified(conn, table, name)}).scalar_one())


def reindex_concurrently(conn: Connection, table: Table, name: str) -> None:
    """Rebuild an index without blocking writes (outside a transaction)."""
    conn.exec_driver_sql(f"REINDEX INDEX CONCURRENTLY {_qualified(conn, table, name)}")


def drop_index_concurrently(conn: Connection, table: Table, name: str) -> None:
    """Drop an index without blocking writes (outside a transaction)."""
    conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {_qualified(conn, table, name)}")


# --- workers ---------------------------------------------------------------------------------


def insert_worker(
    conn: Connection, worker_id: str, hostname: str, pid: int, concurrency: int
) -> None:
    """Register a live worker."""
    conn.execute(
        insert(_workers).values(id=worker_id, hostname=hostname, pid=pid, concurrency=concurrency)
    )


def touch_worker(conn: Connection, worker_id: str) -> bool:
    """Record a worker's heartbeat; False when its row is gone (it was pruned as dead)."""
    result = conn.execute(
        update(_workers).where(_workers.c.id == worker_id).values(heartbeat_at=db_now())
    )
    return result.rowcount == 1


def delete_worker(conn: Connection, worker_id: str) -> None:
    """Unregister a worker that stops."""
    conn.execute(delete(_workers).where(_workers.c.id == worker_id))


def delete_stale_workers(conn: Connection, stale_seconds: float) -> int:
    """Forget workers whose last heartbeat is older than ``stale_seconds``."""
    return conn.execute(
        delete(_workers).where(_workers.c.heartbeat_at < db_now_plus(-stale_seconds))
    ).rowcount


def leader_worker_id(conn: Connection, stale_seconds: float) -> str | None:
    """The live worker that runs distribution: the longest-running one."""
    return conn.execute(
        select(_workers.c.id)
        .where(_workers.c.heartbeat_at >= db_now_plus(-stale_seconds))
        .order_by(_workers.c.started_at, _workers.c.id)
        .limit(1)
    ).scalar_one_or_none()


def count_live_workers(conn: Connection, stale_seconds: float) -> int:
    """Workers that heartbeated within ``stale_seconds``."""
    return int(
        conn.execute(
            select(func.count()).where(_workers.c.heartbeat_at >= db_now_plus(-stale_seconds))
        ).scalar_one()
    )


# --- status ----------------------------------------------------------------------------------


def count_buffer_rows(conn: Connection, table: Table, *, unclaimed: bool) -> int:
    """Rows of a buffer: the unclaimed ones, or the claimed ones (in groups)."""
    condition = table.c.group_id.is_(None) if unclaimed else table.c.group_id.is_not(None)
    return int(conn.execute(select(func.count()).where(condition)).scalar_one())


def oldest_event_age(conn: Connection, table: Table) -> float | None:
    """Seconds since the oldest event still in a buffer was written; None when it is empty.

    Ids grow with time, so the lowest id is the oldest event: one primary-key lookup.
    """
    age = conn.execute(
        select(age_seconds(table.c.created_at)).order_by(table.c.id).limit(1)
    ).scalar_one_or_none()
    return None if age is None else max(float(age), 0.0)


def job_counts(conn: Connection) -> dict[tuple[str, str, str], int]:
    """Jobs by (handler, kind, state): :class:`outbox.schema.JobState`."""
    state = case(
        (_refused(), schema.JobState.REFUSED.value),
        (_jobs.c.lease_token.is_not(None), schema.JobState.RUNNING.value),
        (_jobs.c.attempts > 0, schema.JobState.RETRYING.value),
        else_=schema.JobState.WAITING.value,
    )
    rows = conn.execute(
        select(_jobs.c.handler, _jobs.c.kind, state, func.count()).group_by(
            _jobs.c.handler, _jobs.c.kind, state
        )
    )
    return {(h, k, s): int(n) for h, k, s, n in rows}


def max_failed_attempts(conn: Connection) -> dict[str, int]:
    """The most failed attempts of any group waiting for its next attempt, per handler.

    A waiting batch job's ``attempts`` counts attempts that ended without success; a running
    one's includes the attempt in progress, so only waiting jobs are looked at.
    """
    rows = conn.execute(
        select(_jobs.c.handler, func.max(_jobs.c.attempts))
        .where(_jobs.c.kind == schema.JobKind.BATCH, _jobs.c.lease_token.is_(None))
        .group_by(_jobs.c.handler)
    )
    return {h: int(n) for h, n in rows}


def archive_counts(conn: Connection) -> dict[tuple[str, str], int]:
    """Archived rows by (handler, status); served by ``ix_outbox_archive_handler_status``."""
    rows = conn.execute(
        select(_archive.c.handler, _archive.c.status, func.count()).group_by(
            _archive.c.handler, _archive.c.status
        )
    )
    return {(h, s): int(n) for h, s, n in rows}


# --- archive: replay and prune --------------------------------------------------------------


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


def database_now(conn: Connection) -> Any:
    """The database clock, read once (for tests and status output)."""
    return conn.execute(select(db_now())).scalar_one()


# --- notifications (PostgreSQL) -------------------------------------------------------------

NOTIFY_CHANNEL = "outbox"
NOTIFY_FUNCTION = "outbox_notify"
JOBS_NOTIFICATION = "outbox_jobs"


def notify_function_ddl() -> str:
    """The trigger function that announces new events on the ``outbox`` channel.

    NOTIFY is transactional: listeners hear it only once the inserting transaction commits,
    and notifications with the same payload within one transaction are delivered once.
    """
    return (
        f"CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_notify('{NOTIFY_CHANNEL}', TG_TABLE_NAME); RETURN NULL; END $$"
    )


def notify_trigger_ddl(dialect: SADialect, table: Table) -> list[str]:
    """Statements that (re)create a buffer's notify trigger: once per INSERT statement, not row."""
    quote = dialect.identifier_preparer
    trigger = quote.quote(f"{NOTIFY_FUNCTION}_{table.name}"[:63])
    target = quote.format_table(table)
    return [
        f"DROP TRIGGER IF EXISTS {trigger} ON {target}",
        f"CREATE TRIGGER {trigger} AFTER INSERT ON {target} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {NOTIFY_FUNCTION}()",
    ]


def drop_notify_trigger_ddl(dialect: SADialect, table: Table) -> str:
    """The statement that removes a buffer's notify trigger."""
    quote = dialect.identifier_preparer
    trigger = quote.quote(f"{NOTIFY_FUNCTION}_{table.name}"[:63])
    return f"DROP TRIGGER IF EXISTS {trigger} ON {quote.format_table(table)}"


def notify_jobs(conn: Connection) -> None:
    """Wake idle workers: new jobs are waiting (sent at commit, PostgreSQL only)."""
    conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, JOBS_NOTIFICATION)))
