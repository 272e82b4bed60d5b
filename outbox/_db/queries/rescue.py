"""Statements on ``outbox_jobs`` when a lease runs out or its holder is gone: the rescue, and
who holds jobs while silent."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.queries.attempts import record_attempts
from outbox._db.queries.workers import gone_workers
from outbox._db.types import SilentHolder
from outbox.schema import db_now

_jobs = schema.jobs
_workers = schema.workers


# What a rescued job's last_error says: its attempt was interrupted, not failed by the handler.
RESCUED_ERROR = "lease expired: its worker stopped before finishing"


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
    return rescue_picked(conn, dialect, expired)


def rescue_jobs_of_gone_workers(conn: Connection, dialect: str, stale_seconds: float) -> int:
    """Free the jobs held by workers whose heartbeat is older than ``stale_seconds``, before
    their lease runs out: their holder is gone, and waiting out the lease only delays them.

    Like :func:`rescue_expired_jobs`, it takes the lease token away, so that each finishing
    write of a holder that was only slow changes nothing (the fence), and skips rows locked by
    a completion in progress (``FOR UPDATE SKIP LOCKED``; the workers subquery reads without
    locking). Only holders with a row are judged: a job leased by code that never registered
    a worker (``outbox.testing.drain``) keeps its lease to its end. Refused jobs (no expiry)
    are left alone. Served by the primary key of ``outbox_workers`` and the
    ``lease_expires_at`` index of ``outbox_jobs``.
    """
    gone = gone_workers(stale_seconds)
    held = select(_jobs.c.id).where(
        _jobs.c.lease_token.is_not(None),
        _jobs.c.lease_expires_at.is_not(None),
        _jobs.c.lease_owner.in_(gone),
    )
    return rescue_picked(conn, dialect, held)


def rescue_picked(conn: Connection, dialect: str, pick: Any) -> int:
    """Free the picked jobs, due now, their token taken away; how many. Each batch job's
    attempt is recorded as ended by its lease (``outbox_attempts``), in the same transaction."""
    values = {
        "lease_owner": None,
        "lease_token": None,
        "lease_expires_at": None,
        "run_at": db_now(),
        "last_error": RESCUED_ERROR,
    }
    returning = [_jobs.c.id, _jobs.c.handler, _jobs.c.group_id, _jobs.c.attempts]
    rows = dialects.statements(dialect).update_picked(conn, _jobs, pick, values, returning)
    record_attempts(
        conn,
        [
            {
                "handler": row.handler,
                "group_id": row.group_id,
                "attempt": int(row.attempts),
                "outcome": schema.AttemptOutcome.LEASE_EXPIRED.value,
                "worker": None,
                "error": RESCUED_ERROR,
            }
            for row in rows
            if row.group_id is not None
        ],
    )
    return len(rows)


def silent_holders(conn: Connection, silent_seconds: float) -> list[SilentHolder]:
    """The leased jobs whose holder has not heartbeated for ``silent_seconds``, oldest
    heartbeat first: what ``outbox status`` shows as held by a worker that seems gone.

    A join on the workers' primary key; reads only, locks nothing. Refused jobs (no expiry)
    are not held by anyone and are left out.
    """
    rows = conn.execute(
        select(
            _jobs.c.handler,
            _jobs.c.kind,
            _jobs.c.group_id,
            _workers.c.id,
            age_seconds(_workers.c.heartbeat_at),
            -age_seconds(_jobs.c.lease_expires_at),
        )
        .join(_workers, _workers.c.id == _jobs.c.lease_owner)
        .where(
            _jobs.c.lease_token.is_not(None),
            _jobs.c.lease_expires_at.is_not(None),
            # As judged gone (see gone_workers): older releases' workers wait for their leases.
            _workers.c.generation.is_not(None),
            _workers.c.heartbeat_at < db_now_plus(-silent_seconds),
        )
        .order_by(_workers.c.heartbeat_at, _jobs.c.id)
    )
    return [
        SilentHolder(handler, kind, group_id, holder, float(age), float(left))
        for handler, kind, group_id, holder, age, left in rows
    ]
