"""Statements on ``outbox_jobs`` for an executor that hands jobs out as messages (Celery): which
due jobs a message should be published for. Reads only; a message is a hint, and the job it
names is leased, fenced, by the job runner when the message arrives."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select

from outbox import schema
from outbox._db.dialects.clock import db_now_plus
from outbox._db.queries.handlers import not_paused
from outbox._db.queries.rescue import rescue_picked
from outbox.schema import db_now

_jobs = schema.jobs


def overdue_jobs(
    conn: Connection, handlers: Sequence[str], *, overdue_seconds: float, limit: int
) -> list[int]:
    """The ids of up to ``limit`` jobs of ``handlers`` (not paused) with no lease that have been
    due for longer than ``overdue_seconds``, most urgent band first, then the longest due:
    the jobs whose message was lost, or never sent.

    A plain read through the partial index ``ix_outbox_jobs_ready (priority, run_at, id) WHERE
    lease_token IS NULL``, the one acquisition uses; it locks nothing.
    """
    if not handlers or limit <= 0:
        return []
    rows = conn.execute(
        select(_jobs.c.id)
        .where(
            _jobs.c.lease_token.is_(None),
            _jobs.c.run_at <= db_now_plus(-overdue_seconds),
            _jobs.c.handler.in_(list(handlers)),
            not_paused(_jobs.c.handler),
        )
        .order_by(_jobs.c.priority, _jobs.c.run_at, _jobs.c.id)
        .limit(limit)
    )
    return [int(job_id) for (job_id,) in rows]


def newest_due_jobs(
    conn: Connection,
    handlers: Sequence[str],
    *,
    limit: int,
    kind: schema.JobKind | None = None,
    last_error: str | None = None,
) -> list[int]:
    """The ids of up to ``limit`` due jobs of ``handlers`` with no lease, the newest first (by
    due time, then id): those a distribution just enqueued (``kind`` claim), or a rescue just
    freed (``last_error`` the rescue's). Paused handlers' too: a message for one of them is
    given back when it arrives, as under ``outbox work``.

    A plain read of the unleased jobs (the partial index ``ix_outbox_jobs_ready``); it locks
    nothing.
    """
    if not handlers or limit <= 0:
        return []
    pick = select(_jobs.c.id).where(
        _jobs.c.lease_token.is_(None),
        _jobs.c.run_at <= db_now(),
        _jobs.c.handler.in_(list(handlers)),
    )
    if kind is not None:
        pick = pick.where(_jobs.c.kind == kind)
    if last_error is not None:
        pick = pick.where(_jobs.c.last_error == last_error)
    rows = conn.execute(pick.order_by(_jobs.c.run_at.desc(), _jobs.c.id.desc()).limit(limit))
    return [int(job_id) for (job_id,) in rows]


def give_back_jobs_of(conn: Connection, dialect: str, worker_id: str) -> int:
    """Free every job leased to ``worker_id``, due at once, as a rescue frees a gone worker's
    (their attempts stay counted and are recorded as ended by their lease; ``last_error`` the
    rescue's); how many. For a process that stops mid-job: its work is taken again at once
    rather than when its heartbeat is judged silent.

    Rows locked by a completion in progress are skipped (``FOR UPDATE SKIP LOCKED``): that
    completion's own fence decides them. Refused jobs (no expiry) are left alone.
    """
    held = select(_jobs.c.id).where(
        _jobs.c.lease_owner == worker_id,
        _jobs.c.lease_token.is_not(None),
        _jobs.c.lease_expires_at.is_not(None),
    )
    return rescue_picked(conn, dialect, held)
