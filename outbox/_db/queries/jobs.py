"""Statements on ``outbox_jobs``: claim jobs, acquisition, leases and the fence, rescue, refused
groups, and the counts ``status`` shows."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    case,
    delete,
    func,
    insert,
    select,
    update,
)

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.queries.handlers import not_paused
from outbox._db.types import JobRow, RefusedGroup
from outbox.schema import db_now

_jobs = schema.jobs
_workers = schema.workers


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
    rows = [
        {"kind": schema.JobKind.CLAIM, "handler": handler, "slot": s, "priority": priority}
        for s in slots
    ]
    return dialects.statements(dialect).insert_ignoring_duplicates(conn, _jobs, rows)


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
    fresh_first: bool = False,
) -> list[JobRow]:
    """Lease up to ``limit`` due jobs of handlers not paused, most urgent band first, then the
    longest due (``fresh_first``: jobs never attempted before any other).

    Served by the partial index ``ix_outbox_jobs_ready (priority, run_at, id) WHERE lease_token
    IS NULL``, through which the pick is made; the database's own ``update_picked`` leases the
    jobs it picks so that concurrent workers take disjoint ones without waiting (``FOR UPDATE
    SKIP LOCKED`` on PostgreSQL and MariaDB; SQLite's transaction holds the write lock).

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
        .where(
            _jobs.c.lease_token.is_(None),
            _jobs.c.run_at <= db_now(),
            kinds,
            not_paused(_jobs.c.handler),
        )
        .order_by(
            # A circuit breaker's probe: a group never attempted, rather than one that failed
            # before and may hold a poison event. One handler's due jobs, sorted apart from the
            # index's order: few while a breaker is open.
            *([case((_jobs.c.attempts > 0, 1), else_=0)] if fresh_first else []),
            _jobs.c.priority,
            _jobs.c.run_at,
            _jobs.c.id,
        )
        .limit(limit)
    )
    rows = dialects.statements(dialect).update_picked(
        conn,
        _jobs,
        pick,
        _lease(worker_id, token, lease_seconds),
        _LEASED,
        index="ix_outbox_jobs_ready",
    )
    jobs = [JobRow(**row._mapping) for row in rows]
    return sorted(jobs, key=lambda j: (j.priority, j.id))


# What a worker holds of a job it leased (:class:`JobRow`).
_LEASED = (
    _jobs.c.id,
    _jobs.c.kind,
    _jobs.c.handler,
    _jobs.c.slot,
    _jobs.c.group_id,
    _jobs.c.priority,
    _jobs.c.attempts,
    _jobs.c.lease_token,
    _jobs.c.last_error,
    _jobs.c.deferrals,
    _jobs.c.lease_owner,
)


def _lease(worker_id: str, token: uuid.UUID, lease_seconds: float) -> dict[str, Any]:
    """The values that lease a job: its holder, the fence's token, when the lease ends, and one
    attempt more."""
    return {
        "lease_owner": worker_id,
        "lease_token": token,
        "lease_expires_at": db_now_plus(lease_seconds),
        "attempts": _jobs.c.attempts + 1,
    }


def lease_job(
    conn: Connection,
    dialect: str,
    *,
    job_id: int,
    worker_id: str,
    token: uuid.UUID,
    lease_seconds: float,
    handlers: Sequence[str] | None = None,
    caps: Mapping[str, int] | None = None,
) -> JobRow | None:
    """Lease the job ``job_id`` when it is due, unleased and its handler not paused (and one of
    ``handlers``, when given); None otherwise (leased by another, gone, not due yet, paused,
    another handler's).

    For an executor handed one job's id. The row is picked by its primary key ``FOR UPDATE SKIP
    LOCKED`` (SQLite: its transaction holds the write lock), so that two transactions leasing
    the same job at once never both get it: the second skips it and gets None rather than
    waiting. ``caps``: handler -> its fleet-wide cap on groups in flight; a batch job of a
    capped handler is leased only while fewer than its cap are, counted as
    :func:`acquire_capped_batch_jobs` counts.
    """
    if caps:
        found = conn.execute(
            select(_jobs.c.handler, _jobs.c.kind).where(_jobs.c.id == job_id)
        ).first()
        if found is None:
            return None
        cap = caps.get(found.handler)
        batch = found.kind == schema.JobKind.BATCH
        if batch and cap is not None and in_flight(conn, dialect, found.handler) >= cap:
            return None
    pick = select(_jobs.c.id).where(
        _jobs.c.id == job_id,
        _jobs.c.lease_token.is_(None),
        _jobs.c.run_at <= db_now(),
        not_paused(_jobs.c.handler),
        *([] if handlers is None else [_jobs.c.handler.in_(handlers)]),
    )
    rows = dialects.statements(dialect).update_picked(
        conn, _jobs, pick, _lease(worker_id, token, lease_seconds), _LEASED
    )
    return JobRow(**rows[0]._mapping) if rows else None


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
    fresh_first: bool = False,
) -> list[JobRow]:
    """Lease batch jobs of a handler with a fleet-wide cap on groups in flight (``fresh_first``:
    see :func:`acquire_jobs`).

    Count-then-lease is only exact when no other worker does the same at once: the count is
    the database's ``count_exclusively`` (a per-handler advisory lock on PostgreSQL, the write
    lock on SQLite, every batch job of the handler locked on MariaDB, through
    ``uq_outbox_jobs_claim_slot``'s leading ``handler``), so a second worker's count waits for
    the first one's leases to commit, and then sees them.
    """
    room = min(cap - in_flight(conn, dialect, handler), limit)
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
        fresh_first=fresh_first,
    )


def in_flight(conn: Connection, dialect: str, handler: str) -> int:
    """A capped handler's groups in flight: its batch jobs leased, and not refused (a refused
    group runs nowhere), counted exclusively (see :func:`acquire_capped_batch_jobs`): no other
    session counts or leases a batch job of the handler under the cap until this transaction
    ends, and this count sees every lease committed before it."""
    mine = (_jobs.c.handler == handler, _jobs.c.kind == schema.JobKind.BATCH)
    leased = _jobs.c.lease_expires_at.is_not(None)
    return int(
        dialects.statements(dialect).count_exclusively(conn, f"outbox:{handler}", mine, leased)
    )


def within_cap(conn: Connection, dialect: str, handler: str, cap: int) -> bool:
    """Whether a capped handler's groups in flight, a group just leased among them, are no
    more than its ``cap``: a claim that leased its group to its worker asks before handling
    it. Counting its own lease keeps the cap whatever order the fleet's leases commit in: of
    two claims leased at once, each sees the other's lease or counts before it commits and is
    then seen by it (the count is exclusive, as a capped acquisition's)."""
    return in_flight(conn, dialect, handler) <= cap


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


def undistributed_age(
    conn: Connection, table: Any, handler: str, only: ColumnElement[bool] | None = None
) -> float | None:
    """Seconds the oldest unclaimed event of a buffer has waited while its handler has no
    claim job at all; None when nothing waits or a claim job exists.

    Why: a distribution leaves a claim job for waiting events, and a claim job lives until a
    claim finds the buffer drained, so events that wait long with none mean nothing
    distributes. ``only``: the rows a claim may take now (an ordered handler's), as the
    distributor counts them. One step into the partial index ``ix_<table>_unclaimed`` and one
    into ``uq_outbox_jobs_claim_slot`` (whose leading column is ``handler``).
    """
    claim_job = select(_jobs.c.id).where(
        _jobs.c.handler == handler, _jobs.c.kind == schema.JobKind.CLAIM
    )
    stmt = (
        select(age_seconds(table.c.created_at))
        .where(table.c.group_id.is_(None), ~claim_job.exists())
        .order_by(table.c.id)
        .limit(1)
    )
    if only is not None:
        stmt = stmt.where(only)
    age = conn.execute(stmt).scalar_one_or_none()
    return None if age is None else max(float(age), 0.0)


def next_job_due(conn: Connection, handlers: Sequence[str]) -> float | None:
    """Seconds until the soonest job of ``handlers`` that nobody holds is due (0: due now);
    None when none waits.

    A paused handler's jobs and refused groups (they hold a token) do not count: nothing may
    run them now. A held job is its holder's, or the rescue's once its lease ends. One read of
    ``MIN(run_at)`` over the free jobs (the partial index ``ix_outbox_jobs_ready`` holds
    them); the job table is small: jobs, not events.
    """
    soonest = (
        select(func.min(_jobs.c.run_at))
        .where(
            _jobs.c.handler.in_(list(handlers)),
            _jobs.c.lease_token.is_(None),
            not_paused(_jobs.c.handler),
        )
        .scalar_subquery()
    )
    age = conn.execute(select(age_seconds(soonest))).scalar_one_or_none()
    return None if age is None else max(-float(age), 0.0)


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


def return_job(
    conn: Connection, job_id: int, token: uuid.UUID, *, delay_seconds: float = 0.0
) -> bool:
    """Give back a leased job that could not start, as if it had not been leased: its attempt
    is not counted and its last error stays; ``delay_seconds``: due again only then. False when
    the lease was lost."""
    values: dict[str, Any] = {
        "lease_owner": None,
        "lease_token": None,
        "lease_expires_at": None,
        "attempts": _jobs.c.attempts - 1,
    }
    if delay_seconds > 0:
        values["run_at"] = db_now_plus(delay_seconds)
    result = conn.execute(
        update(_jobs).where(_jobs.c.id == job_id, _jobs.c.lease_token == token).values(values)
    )
    return result.rowcount == 1


def defer_job(
    conn: Connection, job_id: int, token: uuid.UUID, *, delay_seconds: float, error: str
) -> bool:
    """Give a job back to run again after ``delay_seconds``, its attempt not counted and
    counted as a deferral instead (the downstream said when to come back). False when the lease
    was lost."""
    result = conn.execute(
        update(_jobs)
        .where(_jobs.c.id == job_id, _jobs.c.lease_token == token)
        .values(
            lease_owner=None,
            lease_token=None,
            lease_expires_at=None,
            run_at=db_now_plus(delay_seconds),
            attempts=_jobs.c.attempts - 1,
            deferrals=_jobs.c.deferrals + 1,
            last_error=error,
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
    deferrals: int = 0,
    delay_seconds: float = 0.0,
    error: str | None = None,
    lease: tuple[str, uuid.UUID, float] | None = None,
) -> int:
    """Enqueue the batch job of a freshly claimed (or split off) group; returns its id.

    ``lease``: (worker id, token, seconds) to create the job already leased, as its first
    attempt, by the worker that claimed the group and will handle it at once.
    """
    values = batch_job_values(
        handler=handler,
        group_id=group_id,
        priority=priority,
        attempts=attempts,
        run_at=db_now_plus(delay_seconds),
        lease=lease,
    )
    values["last_error"] = error
    if deferrals:
        values["deferrals"] = deferrals
    result = conn.execute(insert(_jobs).values(values))
    return int(result.inserted_primary_key[0])  # type: ignore[index]


def batch_job_values(
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


def batch_job_of_group(conn: Connection, group_id: uuid.UUID) -> int | None:
    """The id of a group's batch job, if it has one."""
    stmt = select(_jobs.c.id).where(
        _jobs.c.group_id == group_id, _jobs.c.kind == schema.JobKind.BATCH
    )
    found = conn.execute(stmt).scalar_one_or_none()
    return None if found is None else int(found)


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
