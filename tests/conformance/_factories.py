"""Rows for the conformance tests, written with plain statements rather than with the
operations under test, and readers that look at what an operation left behind."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    CursorResult,
    Double,
    Engine,
    Numeric,
    String,
    Table,
    TypeDecorator,
    Uuid,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin, schema
from outbox._core.version import VERSION
from outbox._db.dialects import db_now_plus
from tests.models import ActivityEvent

HANDLER = "conformance"
OTHER_HANDLER = "conformance-other"
WORKER = "worker-1"
OTHER_WORKER = "worker-2"
LEASE_SECONDS = 30.0
ACTIVITY = cast(Table, ActivityEvent.__table__)

_jobs = schema.jobs


# --- outbox_jobs ------------------------------------------------------------------------------


def add_batch_job(
    engine: Engine,
    *,
    handler: str = HANDLER,
    group_id: uuid.UUID | None = None,
    priority: int = 0,
    due_in: float = -1.0,
    attempts: int = 0,
    last_error: str | None = None,
) -> int:
    """A batch job waiting for a worker, due ``due_in`` seconds from now (past by default)."""
    return _add_job(
        engine,
        kind=schema.JobKind.BATCH,
        handler=handler,
        group_id=group_id or uuid.uuid4(),
        priority=priority,
        run_at=db_now_plus(due_in),
        attempts=attempts,
        last_error=last_error,
    )


def add_claim_job(
    engine: Engine,
    slot: int,
    *,
    handler: str = HANDLER,
    priority: int = 0,
    due_in: float = -1.0,
    attempts: int = 0,
) -> int:
    """A claim job in ``slot``, waiting for a worker."""
    return _add_job(
        engine,
        kind=schema.JobKind.CLAIM,
        handler=handler,
        slot=slot,
        priority=priority,
        run_at=db_now_plus(due_in),
        attempts=attempts,
    )


def _add_job(engine: Engine, **values: Any) -> int:
    with engine.begin() as conn:
        return _inserted_id(conn.execute(insert(_jobs).values(values)))


def _inserted_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def add_batch_jobs_due_together(engine: Engine, count: int, *, due_in: float = -5.0) -> list[int]:
    """``count`` batch jobs written by one statement: the same due time to the microsecond."""
    rows = [
        {
            "kind": schema.JobKind.BATCH,
            "handler": HANDLER,
            "group_id": uuid.uuid4(),
            "priority": 0,
            "run_at": db_now_plus(due_in),
        }
        for _ in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(insert(_jobs).values(rows))
        groups = [row["group_id"] for row in rows]
        found = conn.execute(select(_jobs.c.id).where(_jobs.c.group_id.in_(groups)))
        return sorted(found.scalars())


def lease(
    engine: Engine,
    job_id: int,
    *,
    owner: str = WORKER,
    expires_in: float = LEASE_SECONDS,
) -> uuid.UUID:
    """Lease a job to ``owner`` as an acquisition does (its attempt counted); returns the token."""
    token = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(
                lease_owner=owner,
                lease_token=token,
                lease_expires_at=db_now_plus(expires_in),
                attempts=_jobs.c.attempts + 1,
            )
        )
    return token


def refuse(engine: Engine, job_id: int, error: str = "refused for good") -> uuid.UUID:
    """Hold a job as refused (a token, no expiry), as a refused finishing write leaves it."""
    token = lease(engine, job_id)
    with engine.begin() as conn:
        conn.execute(
            update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(lease_owner=None, lease_expires_at=None, last_error=error)
        )
    return token


def job(engine: Engine, job_id: int) -> dict[str, Any] | None:
    """A job's columns, None when it is gone."""
    with engine.connect() as conn:
        row = conn.execute(select(_jobs).where(_jobs.c.id == job_id)).first()
    return None if row is None else dict(row._mapping)


def existing_job(engine: Engine, job_id: int) -> dict[str, Any]:
    """A job's columns; fails when it is gone."""
    found = job(engine, job_id)
    assert found is not None, f"job {job_id} is gone"
    return found


def job_ids(engine: Engine) -> list[int]:
    """Every job's id, in order."""
    with engine.connect() as conn:
        return list(conn.execute(select(_jobs.c.id).order_by(_jobs.c.id)).scalars())


def claim_slots(engine: Engine, handler: str = HANDLER) -> list[int | None]:
    """The slots of a handler's claim jobs, as the table holds them (duplicates included)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(_jobs.c.slot)
            .where(_jobs.c.handler == handler, _jobs.c.kind == schema.JobKind.CLAIM)
            .order_by(_jobs.c.slot)
        )
        return list(rows.scalars())


# --- buffers ----------------------------------------------------------------------------------


def add_events(
    engine: Engine,
    count: int,
    *,
    table: Table = ACTIVITY,
    group_id: uuid.UUID | None = None,
    age: float | None = None,
) -> list[int]:
    """``count`` events in a buffer, committed; ``group_id`` writes them claimed by that group,
    ``age`` dates them ``age`` seconds back. Returns their ids, in order."""
    with engine.begin() as conn:
        before = conn.execute(select(func.coalesce(func.max(table.c.id), 0))).scalar_one()
        rows = [_event_values(table, n, group_id) for n in range(count)]
        if age is not None:
            for row in rows:
                row["created_at"] = db_now_plus(-age)
        for row in rows:  # one statement each: a SQL expression per row, and ids in order
            conn.execute(insert(table).values(row))
        found = conn.execute(select(table.c.id).where(table.c.id > before).order_by(table.c.id))
        return list(found.scalars())


def _event_values(table: Table, n: int, group_id: uuid.UUID | None) -> dict[str, Any]:
    values: dict[str, Any] = {"group_id": group_id}
    if "activity_id" in table.c:
        values["activity_id"] = n
    if "address" in table.c:
        values["address"] = f"user{n}@example.com"
    return values


def group_ids(engine: Engine, group_id: uuid.UUID, table: Table = ACTIVITY) -> list[int]:
    """The ids of a group's rows, in order."""
    with engine.connect() as conn:
        found = conn.execute(
            select(table.c.id).where(table.c.group_id == group_id).order_by(table.c.id)
        )
        return list(found.scalars())


def unclaimed_ids(engine: Engine, table: Table = ACTIVITY) -> list[int]:
    """The ids of the rows no group has claimed, in order."""
    with engine.connect() as conn:
        found = conn.execute(
            select(table.c.id).where(table.c.group_id.is_(None)).order_by(table.c.id)
        )
        return list(found.scalars())


def buffer_ids(engine: Engine, table: Table = ACTIVITY) -> list[int]:
    """The ids of every row of a buffer, in order."""
    with engine.connect() as conn:
        return list(conn.execute(select(table.c.id).order_by(table.c.id)).scalars())


def date_back(engine: Engine, event_ids: list[int], age: float, table: Table = ACTIVITY) -> None:
    """Make events ``age`` seconds old."""
    with engine.begin() as conn:
        conn.execute(
            update(table).where(table.c.id.in_(event_ids)).values(created_at=db_now_plus(-age))
        )


# --- outbox_archive ---------------------------------------------------------------------------


def add_archived(
    engine: Engine,
    *,
    handler: str = HANDLER,
    status: str = schema.ArchiveStatus.SUCCEEDED,
    group_id: uuid.UUID | None = None,
    age: float = 0.0,
    error: str | None = None,
) -> int:
    """One archive row, archived ``age`` seconds ago."""
    values = {
        "handler": handler,
        "buffer": ACTIVITY.name,
        "event_id": 1,
        "group_id": group_id or uuid.uuid4(),
        "status": status,
        "attempts": 1,
        "error": error,
        "payload": {"activity_id": 1, "kind": "viewed"},
        "archived_at": db_now_plus(-age),
    }
    with engine.begin() as conn:
        return _inserted_id(conn.execute(insert(schema.archive).values(values)))


def archived(engine: Engine) -> list[dict[str, Any]]:
    """Every archive row, by id (the payload as the driver reads it)."""
    with engine.connect() as conn:
        rows = conn.execute(select(schema.archive).order_by(schema.archive.c.id))
        return [dict(row._mapping) for row in rows]


def archive_ids(engine: Engine) -> list[int]:
    """Every archive row's id, in order."""
    return [int(row["id"]) for row in archived(engine)]


# --- outbox_workers ---------------------------------------------------------------------------


def add_worker(
    engine: Engine,
    worker_id: str,
    *,
    started_ago: float = 0.0,
    heartbeat_ago: float = 0.0,
    version: str | None = VERSION,
    generation: int | None = schema.GENERATION,
    older_release: bool = False,
) -> None:
    """A worker row that started ``started_ago`` and last heartbeated ``heartbeat_ago``
    seconds ago, as this outbox writes it; ``older_release``: with no version and generation,
    as a release before 0.2 writes it."""
    if older_release:
        version, generation = None, None
    with engine.begin() as conn:
        conn.execute(
            insert(schema.workers).values(
                id=worker_id,
                hostname="host",
                pid=1,
                concurrency=1,
                started_at=db_now_plus(-started_ago),
                heartbeat_at=db_now_plus(-heartbeat_ago),
                version=version,
                generation=generation,
            )
        )


def add_workers_started_together(engine: Engine, ids: list[str]) -> None:
    """Live workers written by one statement: the same start time to the microsecond."""
    rows = [
        {
            "id": worker_id,
            "hostname": "host",
            "pid": 1,
            "concurrency": 1,
            "started_at": db_now_plus(-100.0),
        }
        for worker_id in ids
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.workers).values(rows))


def worker_ids(engine: Engine) -> list[str]:
    """The registered workers, by id."""
    with engine.connect() as conn:
        found = conn.execute(select(schema.workers.c.id).order_by(schema.workers.c.id))
        return list(found.scalars())


def worker(engine: Engine, worker_id: str) -> dict[str, Any]:
    """A worker's columns."""
    with engine.connect() as conn:
        row = conn.execute(select(schema.workers).where(schema.workers.c.id == worker_id)).one()
        return dict(row._mapping)


# --- a buffer of several column types ---------------------------------------------------------


class Tagged(TypeDecorator[str]):
    """A type that converts on the way in and out: stored as ``tag:<value>``."""

    impl = String(100)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else f"tag:{value}"

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else value.removeprefix("tag:")


class TypedBase(DeclarativeBase):
    pass


class TypedEvent(BufferMixin, TypedBase):
    """A buffer with a few column types whose values each database stores its own way."""

    __tablename__ = "conformance_typed_events"
    text_value: Mapped[str] = mapped_column(String(100))
    big: Mapped[int] = mapped_column(BigInteger)
    number: Mapped[float] = mapped_column(Double)
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 4))
    flag: Mapped[bool]
    moment: Mapped[dt.datetime]
    day: Mapped[dt.date]
    blob: Mapped[bytes]
    reference: Mapped[uuid.UUID] = mapped_column(Uuid)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    tagged: Mapped[str] = mapped_column(Tagged)
    missing: Mapped[str | None] = mapped_column(String(10))


TYPED = cast(Table, TypedEvent.__table__)

TYPED_VALUES: dict[str, Any] = {
    "text_value": "grüße ✓ \"quoted\" 'single'",
    "big": 2**53 + 1,
    "number": 0.1,
    "amount": Decimal("12345678.1234"),
    "flag": True,
    "moment": dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
    "day": dt.date(2024, 2, 29),
    "blob": b"\x00\x01\xfe\xff",
    "reference": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "document": {"nested": {"list": [1, 2.5, "three", None, True]}, "empty": {}},
    "tagged": "value",
    "missing": None,
}
"""One row of :class:`TypedEvent`: values that each database stores its own way."""


def add_typed_events(engine: Engine, count: int, group_id: uuid.UUID | None = None) -> list[int]:
    """``count`` rows of :class:`TypedEvent` (``number`` a whole number in every other one)."""
    rows = [
        {**TYPED_VALUES, "number": 2.0 if n % 2 else 0.1, "big": 2**53 + n, "group_id": group_id}
        for n in range(count)
    ]
    with engine.begin() as conn:
        for row in rows:
            conn.execute(insert(TYPED).values(row))
        return list(conn.execute(select(TYPED.c.id).order_by(TYPED.c.id)).scalars())


def typed_rows(engine: Engine) -> list[dict[str, Any]]:
    """Every row of :class:`TypedEvent`, by id, read as a SELECT reads it."""
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(select(TYPED).order_by(TYPED.c.id))]


def empty(engine: Engine, table: Table) -> None:
    """Delete every row of a table."""
    with engine.begin() as conn:
        conn.execute(delete(table))
