"""Statements on ``outbox_workers``: heartbeats, the leader, the live count; the clock."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from outbox import schema
from outbox._core.version import VERSION
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.types import WorkerAsked, WorkerRow, WorkerVersion
from outbox.schema import db_now

_workers = schema.workers

RUN_ONCE_PREFIX = "once:"
"""How the id of a run-once caller's row begins (``outbox.run_once``): it works for a bounded
time and leaves, so it never leads the fleet, whose leader distributes."""


def insert_worker(
    conn: Connection, worker_id: str, hostname: str, pid: int, concurrency: int
) -> None:
    """Register a live worker, with the outbox version and the schema generation it runs."""
    conn.execute(
        insert(_workers).values(
            id=worker_id,
            hostname=hostname,
            pid=pid,
            concurrency=concurrency,
            version=VERSION,
            generation=schema.GENERATION,
        )
    )


def touch_worker(conn: Connection, worker_id: str) -> bool:
    """Record a worker's heartbeat; False when its row is gone (it was pruned as dead)."""
    result = conn.execute(
        update(_workers).where(_workers.c.id == worker_id).values(heartbeat_at=db_now())
    )
    return result.rowcount == 1


def ask_worker(conn: Connection, worker_id: str, request: str, actor: str) -> bool:
    """Leave an operator's request (``drain`` or ``stop``) in a worker's row, for its next
    heartbeat; False when it has no row."""
    result = conn.execute(
        update(_workers)
        .where(_workers.c.id == worker_id)
        .values(request=request, requested_by=actor)
    )
    return result.rowcount == 1


def worker_request(conn: Connection, worker_id: str) -> WorkerAsked | None:
    """What an operator asked of this worker, and who; None when nothing (by its primary
    key: one row)."""
    row = conn.execute(
        select(_workers.c.request, _workers.c.requested_by).where(
            _workers.c.id == worker_id, _workers.c.request.is_not(None)
        )
    ).first()
    return None if row is None else WorkerAsked(row.request, row.requested_by)


def delete_worker(conn: Connection, worker_id: str) -> None:
    """Unregister a worker that stops."""
    conn.execute(delete(_workers).where(_workers.c.id == worker_id))


def delete_stale_workers(conn: Connection, stale_seconds: float, older_seconds: float) -> int:
    """Forget workers whose last heartbeat is older than ``stale_seconds``; those of releases
    before 0.2 (they record no generation) once it is older than ``older_seconds``."""
    return conn.execute(delete(_workers).where(~_live(stale_seconds, older_seconds))).rowcount


def delete_silent_run_once_callers(conn: Connection, silent_seconds: float) -> int:
    """Forget run-once callers (ids beginning with :data:`RUN_ONCE_PREFIX`) silent for longer
    than ``silent_seconds``: runs killed before they could delete their rows. Judges nothing
    when ``silent_seconds`` is at least a lease: no lease of theirs is extended since."""
    return conn.execute(
        delete(_workers).where(
            _workers.c.id.startswith(RUN_ONCE_PREFIX, autoescape=True),
            _workers.c.heartbeat_at < db_now_plus(-silent_seconds),
        )
    ).rowcount


def gone_workers(stale_seconds: float) -> Select[tuple[str]]:
    """The ids of workers judged gone: silent for ``stale_seconds``. Only workers that record
    a generation (0.2 and newer) are judged so: they heartbeat at least three times in that
    time. A worker of an older release heartbeats at its own pace (every third of its lease,
    whatever ``stale_seconds`` says here): its jobs wait for their leases to end, as its own
    release expects."""
    return select(_workers.c.id).where(
        _workers.c.generation.is_not(None), _workers.c.heartbeat_at < db_now_plus(-stale_seconds)
    )


def _live(stale_seconds: float, older_seconds: float) -> ColumnElement[bool]:
    """Heartbeated within ``stale_seconds``, or within ``older_seconds`` for a worker of a
    release before 0.2 (no generation), which heartbeats at its own, slower, pace."""
    return or_(
        and_(
            _workers.c.generation.is_not(None),
            _workers.c.heartbeat_at >= db_now_plus(-stale_seconds),
        ),
        and_(
            _workers.c.generation.is_(None),
            _workers.c.heartbeat_at >= db_now_plus(-older_seconds),
        ),
    )


def leader_worker_id(conn: Connection, stale_seconds: float) -> str | None:
    """The live worker that runs distribution: the longest-running one, never a run-once
    caller (its id begins with :data:`RUN_ONCE_PREFIX`)."""
    return conn.execute(
        select(_workers.c.id)
        .where(
            _workers.c.heartbeat_at >= db_now_plus(-stale_seconds),
            ~_workers.c.id.startswith(RUN_ONCE_PREFIX, autoescape=True),
        )
        .order_by(_workers.c.started_at, _workers.c.id)
        .limit(1)
    ).scalar_one_or_none()


def count_live_workers(conn: Connection, stale_seconds: float) -> int:
    """Workers that heartbeated within ``stale_seconds``."""
    return live_workers_and_now(conn, stale_seconds)[0]


def live_workers_and_now(conn: Connection, stale_seconds: float) -> tuple[int, Any]:
    """Workers that heartbeated within ``stale_seconds``, and the database's clock as the
    statement read it (a heartbeat's measure of its own clock, at no extra round trip)."""
    count, now = conn.execute(
        select(func.count(), db_now()).where(_workers.c.heartbeat_at >= db_now_plus(-stale_seconds))
    ).one()
    return int(count), now


def live_worker_versions(
    conn: Connection, stale_seconds: float, older_seconds: float
) -> list[WorkerVersion]:
    """Live workers (see :func:`delete_stale_workers` for the two ages), counted by version and
    generation, oldest generation first (those that record none first of all)."""
    live = func.count().label("live")
    rows = conn.execute(
        select(_workers.c.version, _workers.c.generation, live)
        .where(_live(stale_seconds, older_seconds))
        .group_by(_workers.c.version, _workers.c.generation)
    ).all()
    versions = [WorkerVersion(r.version, r.generation, int(r.live)) for r in rows]
    return sorted(versions, key=lambda v: (v.generation or 0, v.version or ""))


def worker_rows(conn: Connection, stale_seconds: float) -> list[WorkerRow]:
    """Every worker row, the longest running first, with the jobs each holds now and its
    ages by the database clock; ``alive``: heartbeated within ``stale_seconds``."""
    jobs = schema.jobs
    held = (
        select(func.count())
        .where(jobs.c.lease_owner == _workers.c.id, jobs.c.lease_expires_at.is_not(None))
        .scalar_subquery()
    )
    rows = conn.execute(
        select(
            _workers.c.id,
            _workers.c.hostname,
            _workers.c.pid,
            _workers.c.concurrency,
            _workers.c.version,
            _workers.c.generation,
            age_seconds(_workers.c.started_at).label("started"),
            age_seconds(_workers.c.heartbeat_at).label("heartbeat"),
            held.label("held"),
            _workers.c.request,
            _workers.c.requested_by,
        ).order_by(_workers.c.started_at, _workers.c.id)
    )
    return [
        WorkerRow(
            r.id,
            r.hostname,
            int(r.pid),
            int(r.concurrency),
            r.version,
            r.generation,
            max(float(r.started), 0.0),
            max(float(r.heartbeat), 0.0),
            int(r.held),
            float(r.heartbeat) <= stale_seconds,
            request=r.request,
            requested_by=r.requested_by,
        )
        for r in rows
    ]


def database_now(conn: Connection) -> Any:
    """The database clock, read once (a process's measure of its own clock's offset, status
    output, tests)."""
    return conn.execute(select(db_now())).scalar_one()
