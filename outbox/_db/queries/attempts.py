"""Statements on ``outbox_attempts``: the attempts of a group that did not end in success,
recorded with its outcome, read by the operator's questions, and deleted once the group is
gone."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, exists, insert, select

from outbox import schema
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.types import AttemptRow

_jobs = schema.jobs
_archive = schema.archive
_attempts = schema.attempts


def group_attempts(conn: Connection, group_id: uuid.UUID, limit: int) -> list[AttemptRow]:
    """A group's attempts that did not end in success, oldest first (the last ``limit``)."""
    stmt = (
        select(
            _attempts.c.attempt,
            _attempts.c.outcome,
            _attempts.c.worker,
            _attempts.c.error,
            age_seconds(_attempts.c.finished_at).label("age"),
            _attempts.c.id,
            _attempts.c.handler,
        )
        .where(_attempts.c.group_id == group_id)
        .order_by(_attempts.c.id.desc())
        .limit(limit)
    )
    rows = list(conn.execute(stmt))
    return [
        AttemptRow(int(r.attempt), r.outcome, r.worker, r.error, max(float(r.age), 0.0), r.handler)
        for r in reversed(rows)
    ]


def record_attempt(
    conn: Connection,
    *,
    handler: str,
    group_id: uuid.UUID,
    attempt: int,
    outcome: str,
    worker: str | None,
    error: str | None,
) -> None:
    """Record an attempt of a group that did not end in success, in the transaction that
    records its outcome."""
    conn.execute(
        insert(_attempts).values(
            handler=handler,
            group_id=group_id,
            attempt=attempt,
            outcome=outcome,
            worker=worker,
            error=error,
        )
    )


def record_attempts(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Record several attempts in one statement (``record_attempt``'s keys)."""
    if rows:
        conn.execute(insert(_attempts), list(rows))


def delete_old_attempts(conn: Connection, older_than_seconds: float, limit: int) -> int:
    """Delete up to ``limit`` attempts finished more than ``older_than_seconds`` ago whose
    group is gone: no job and no dead event of it left (a dead group's history stays as long
    as it does). ``ix_outbox_attempts_finished_at`` serves the pick, the group indexes the
    checks."""
    gone = and_(
        ~exists(select(_jobs.c.id).where(_jobs.c.group_id == _attempts.c.group_id)),
        ~exists(
            select(_archive.c.id).where(
                _archive.c.group_id == _attempts.c.group_id,
                _archive.c.status == schema.ArchiveStatus.DEAD,
            )
        ),
    )
    ids = list(
        conn.execute(
            select(_attempts.c.id)
            .where(_attempts.c.finished_at < db_now_plus(-older_than_seconds), gone)
            .order_by(_attempts.c.finished_at)
            .limit(limit)
        ).scalars()
    )
    if not ids:
        return 0
    return conn.execute(_attempts.delete().where(_attempts.c.id.in_(ids))).rowcount
