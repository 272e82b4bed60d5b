"""The claimer: stamps a fresh group id on up to ``batch_size`` unclaimed rows.

A claim and the batch job of the group it creates are written in one transaction, so a group
never exists without the job that will handle it. Finding nothing is a normal, cheap outcome.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from outbox import _log, _sql
from outbox._db import run_in_transaction
from outbox._faults import AFTER_CLAIM, crash_point
from outbox.app import Handler, Outbox

log = _log.get_logger(__name__)


class LeaseLost(Exception):  # noqa: N818 - an outcome, not an error the user sees
    """Raised inside a transaction to roll it back when the job's lease is no longer ours."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A group just claimed."""

    handler: str
    group_id: uuid.UUID
    size: int


def _claim(conn: Connection, app: Outbox, handler: Handler[Any]) -> Claim | None:
    if handler.max_wait is not None and not _batch_due(conn, handler):
        return None
    group_id = uuid.uuid4()
    size = _sql.claim_rows(conn, app.dialect, handler.table, group_id, handler.batch_size)
    if not size:
        return None
    _sql.insert_batch_job(
        conn, handler=handler.name, group_id=group_id, priority=handler.urgency.priority
    )
    return Claim(handler.name, group_id, size)


def _batch_due(conn: Connection, handler: Handler[Any]) -> bool:
    """A full batch waits, or a partial one is due."""
    full = _sql.count_unclaimed(conn, handler.table, handler.batch_size) >= handler.batch_size
    return full or partial_batch_due(conn, handler)


def partial_batch_due(conn: Connection, handler: Handler[Any]) -> bool:
    """Size-or-time batches: is a batch smaller than ``batch_size`` worth claiming now?

    Always, without ``max_wait``; with it, once the oldest unclaimed event has waited that long.
    """
    if handler.max_wait is None:
        return True
    age = _sql.oldest_unclaimed_age(conn, handler.table)
    return age is not None and age >= handler.max_wait


def run_once(app: Outbox, handler: Handler[Any]) -> Claim | None:
    """Claim one group for ``handler`` and enqueue its batch job; None when nothing waits."""
    return run_in_transaction(app.engine, lambda conn: _claim(conn, app, handler))


def run_claim_job(app: Outbox, handler: Handler[Any], job: _sql.JobRow) -> Claim | None:
    """Run a claim job: claim a group, then finish the job, fenced by its lease.

    A claim that filled a whole batch keeps its slot and runs again at once, because more rows
    are probably waiting; the distributor does not have to come round for each batch.
    """

    def work(conn: Connection) -> Claim | None:
        claim = _claim(conn, app, handler)
        if claim is not None and claim.size == handler.batch_size:
            held = _sql.release_job(conn, job.id, job.lease_token, delay_seconds=0, error=None)
        else:
            held = _sql.delete_job(conn, job.id, job.lease_token)
        if not held:
            raise LeaseLost
        return claim

    try:
        claim = run_in_transaction(app.engine, work, patience=app.settings.lease_seconds)
    except LeaseLost:
        log.warning(_log.LEASE_LOST, handler=handler.name, job_id=job.id, kind=job.kind)
        return None
    if claim is not None:
        crash_point(AFTER_CLAIM)
        log.debug(
            _log.GROUP_CLAIMED, handler=handler.name, group_id=str(claim.group_id), size=claim.size
        )
    return claim
