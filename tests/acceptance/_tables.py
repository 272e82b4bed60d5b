"""Looking at the tables the ``outbox`` command worked on, from the test's own connection."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, func, insert, select

from outbox import db_now, schema
from outbox._db.dialects import db_now_plus
from tests.models import ActivityEvent


def buffer_is_empty(engine: Engine, model: type[Any] = ActivityEvent) -> bool:
    """True when no event is left in the buffer."""
    with engine.connect() as conn:
        return not conn.execute(select(func.count()).select_from(model)).scalar()


def buffer_rows(
    engine: Engine, model: type[Any] = ActivityEvent
) -> list[tuple[int, uuid.UUID | None]]:
    """(id, group_id) of every row still in a buffer, by id."""
    with engine.connect() as conn:
        rows = conn.execute(select(model.id, model.group_id).order_by(model.id))
        return [(int(event_id), group_id) for event_id, group_id in rows]


def jobs(engine: Engine) -> list[dict[str, Any]]:
    """Every row of outbox_jobs, by id."""
    with engine.connect() as conn:
        rows = conn.execute(select(schema.jobs).order_by(schema.jobs.c.id))
        return [dict(row._mapping) for row in rows]


def archive(engine: Engine) -> list[dict[str, Any]]:
    """Every row of outbox_archive, by id."""
    with engine.connect() as conn:
        rows = conn.execute(select(schema.archive).order_by(schema.archive.c.id))
        return [dict(row._mapping) for row in rows]


def add_archived(
    engine: Engine,
    status: str,
    count: int = 1,
    *,
    age: float = 0.0,
    handler: str = "record_activity",
    error: str | None = None,
    group_id: uuid.UUID | None = None,
) -> None:
    """``count`` archive rows of ``status``, archived ``age`` seconds ago (each one group, or
    all of ``group_id``'s)."""
    rows = [
        {
            "handler": handler,
            "buffer": ActivityEvent.__table__.name,
            "event_id": n + 1,
            "group_id": uuid.uuid4() if group_id is None else group_id,
            "status": status,
            "attempts": 1,
            "error": error,
            "payload": {"activity_id": n, "kind": "viewed"},
            "archived_at": db_now_plus(-age),
        }
        for n in range(count)
    ]
    with engine.begin() as conn:
        for row in rows:
            conn.execute(insert(schema.archive).values(row))


def archive_statuses(engine: Engine) -> dict[str, int]:
    """Archive rows by status."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(schema.archive.c.status, func.count()).group_by(schema.archive.c.status)
        )
        return {str(status): int(n) for status, n in rows}


def count(engine: Engine, table: Any) -> int:
    """Rows in a table (or a model's table)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def lease_expired(engine: Engine, group_id: uuid.UUID) -> bool:
    """True once the lease on a group's batch job has run out, by the database clock."""
    jobs_ = schema.jobs
    with engine.connect() as conn:
        return bool(
            conn.execute(
                select(func.count()).where(
                    jobs_.c.group_id == group_id,
                    jobs_.c.lease_expires_at < db_now(),
                )
            ).scalar_one()
        )
