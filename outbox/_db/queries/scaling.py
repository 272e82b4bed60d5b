"""The one read behind desired workers and Apdex: every number :mod:`outbox.ops.scaling` needs,
for every handler, in one statement.

Every number is an index probe or a short range, never a count of buffer rows, so that the read
costs the same with ten rows waiting as with ten million: the ends of a buffer's unclaimed ids
(the partial index ``ix_<table>_unclaimed`` on PostgreSQL and SQLite; on MariaDB the index on
``group_id``, whose NULL entries are ordered by id, the primary key every InnoDB index ends
with) and of all its ids (the primary key) stand for how many rows there are; the small
``outbox_jobs`` is counted per handler (through ``uq_outbox_jobs_claim_slot (handler, slot)``,
or by the planner's scan of the small table); ``outbox_throughput`` is read as each handler's
range of its primary key (handler, minute). Each probe is a scalar subquery: one round trip,
and on PostgreSQL one InitPlan each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Double,
    Engine,
    Float,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    union_all,
)

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.queries.handlers import paused_now
from outbox._db.types import ScalingRow
from outbox.schema import db_now

_jobs = schema.jobs
_handlers = schema.handlers
_throughput = schema.throughput
_workers = schema.workers

MINUTE_SECONDS = 60.0


def reading_connection(engine: Engine) -> Connection:
    """A connection for the one statement of :func:`scaling_rows`, as its database reads one
    statement fastest (on PostgreSQL in autocommit, with no ``BEGIN`` and ``ROLLBACK``)."""
    database = dialects.database_named(engine.dialect.name)
    return engine.connect() if database is None else database.reading_connection(engine)


def scaling_rows(
    conn: Connection,
    buffers: Sequence[tuple[str, Table]],
    *,
    rate_seconds: float,
    apdex_seconds: float,
    stale_seconds: float,
) -> list[ScalingRow]:
    """Per handler of ``buffers`` (its name and buffer table), what waits, what runs and what
    it handled: one statement, a ``UNION ALL`` of one row per handler whose every column is a
    scalar subquery that probes an index (see the module's docstring).

    ``rate_seconds``: how far back the handled events count towards the rate; ``apdex_seconds``:
    how far back they count towards Apdex; ``stale_seconds``: a worker silent longer is not
    counted among the fleet's slots.
    """
    if not buffers:
        return []
    values = {"rate_back": -rate_seconds, "apdex_back": -apdex_seconds}
    values["window_back"] = min(values["rate_back"], values["apdex_back"])
    values["stale_back"] = -stale_seconds
    return [
        ScalingRow(
            handler=r.handler,
            first_unclaimed=_int_or_none(r.first_unclaimed),
            last_unclaimed=_int_or_none(r.last_unclaimed),
            newest_unclaimed_age=_float_or_none(r.newest_unclaimed_age),
            first_id=_int_or_none(r.first_id),
            last_id=_int_or_none(r.last_id),
            oldest_age=_float_or_none(r.oldest_age),
            runnable_groups=int(r.runnable_groups or 0),
            live_leases=int(r.live_leases or 0),
            paused=bool(r.paused),
            recent_handled=int(r.recent_handled or 0),
            recent_seconds=float(r.recent_seconds or 0.0),
            recent_busy=float(r.recent_busy or 0.0),
            busy_handled=int(r.busy_handled or 0),
            handled=int(r.handled or 0),
            satisfied=int(r.satisfied or 0),
            tolerating=int(r.tolerating or 0),
            fleet_slots=int(r.fleet_slots or 0),
        )
        for r in conn.execute(_statement(tuple(buffers)), values)
    ]


@functools.lru_cache(maxsize=64)
def _statement(buffers: tuple[tuple[str, Table], ...]) -> Any:
    """The read of ``buffers``, built once per set of handlers: the windows are bound, so that
    a caller polling every few seconds neither builds nor compiles it again."""
    slots = (
        select(func.coalesce(func.sum(_workers.c.concurrency), 0))
        .where(_workers.c.heartbeat_at >= db_now_plus(_BACK["stale_back"]))
        .scalar_subquery()
    )
    parts = [_one_handler(name, table, slots) for name, table in buffers]
    return parts[0] if len(parts) == 1 else union_all(*parts)


_BACK = {
    name: bindparam(name, type_=Float())
    for name in ("rate_back", "apdex_back", "window_back", "stale_back")
}


def _one_handler(name: str, table: Table, slots: ColumnElement[int]) -> Select[tuple[object, ...]]:
    unclaimed = table.c.group_id.is_(None)
    # ORDER BY id LIMIT 1 rather than min()/max(): the form every database serves from the
    # index's end (SQLite does not take min() of a partial index's column from its end).
    first_unclaimed = _end(table, table.c.id, unclaimed)
    last_unclaimed = _end(table, table.c.id, unclaimed, newest=True)
    newest_unclaimed_age = _end(table, age_seconds(table.c.created_at), unclaimed, newest=True)
    first_id = _end(table, table.c.id)
    last_id = _end(table, table.c.id, newest=True)
    oldest_age = _end(table, age_seconds(table.c.created_at))
    mine = _jobs.c.handler == name
    # A batch job a worker may lease now: not leased (nor held as refused), due, and not
    # deferred, throttled or backing off (those have a run_at ahead).
    runnable_groups = (
        select(func.count())
        .where(
            mine,
            _jobs.c.kind == schema.JobKind.BATCH,
            _jobs.c.lease_token.is_(None),
            _jobs.c.run_at <= db_now(),
        )
        .scalar_subquery()
    )
    live_leases = (
        select(func.count())
        .where(mine, _jobs.c.lease_token.is_not(None), _jobs.c.lease_expires_at > db_now())
        .scalar_subquery()
    )
    paused = select(func.count()).where(_handlers.c.name == name, paused_now()).scalar_subquery()
    minutes = _throughput.c.handler == name
    events = _throughput.c.succeeded + _throughput.c.dead
    recent = _throughput.c.minute >= db_now_plus(_BACK["rate_back"])
    age = age_seconds(_throughput.c.minute)
    # The seconds a minute row covers: 60 for a past minute, the part gone by of this one
    # (a worker's clock a little ahead of the database's counts as one second).
    covered = case((age >= MINUTE_SECONDS, MINUTE_SECONDS), (age < 1.0, 1.0), else_=age)
    in_apdex = _throughput.c.minute >= db_now_plus(_BACK["apdex_back"])
    busy = _throughput.c.busy_seconds
    # Minutes with busy time: what was handled in them over the slots' time spent on it
    # (minutes of workers that keep no busy time stay out of it).
    timed = and_(recent, busy > 0)
    counted = (
        select(
            func.sum(case((recent, events), else_=0)).label("recent_handled"),
            func.sum(case((recent, covered), else_=0.0)).label("recent_seconds"),
            func.sum(case((timed, busy), else_=0.0)).label("recent_busy"),
            func.sum(case((timed, events), else_=0)).label("busy_handled"),
            func.sum(case((in_apdex, events), else_=0)).label("handled"),
            func.sum(case((in_apdex, _throughput.c.satisfied), else_=0)).label("satisfied"),
            func.sum(case((in_apdex, _throughput.c.tolerating), else_=0)).label("tolerating"),
        )
        .where(minutes, _throughput.c.minute >= db_now_plus(_BACK["window_back"]))
        .subquery()
    )
    return select(
        cast(literal(name), String(200)).label("handler"),
        first_unclaimed.label("first_unclaimed"),
        last_unclaimed.label("last_unclaimed"),
        cast(newest_unclaimed_age, Float).label("newest_unclaimed_age"),
        first_id.label("first_id"),
        last_id.label("last_id"),
        cast(oldest_age, Float).label("oldest_age"),
        runnable_groups.label("runnable_groups"),
        live_leases.label("live_leases"),
        cast(paused, Integer).label("paused"),
        cast(counted.c.recent_handled, BigInteger).label("recent_handled"),
        cast(counted.c.recent_seconds, Float).label("recent_seconds"),
        # Double: MariaDB's CAST AS FLOAT keeps single precision.
        cast(counted.c.recent_busy, Double).label("recent_busy"),
        cast(counted.c.busy_handled, BigInteger).label("busy_handled"),
        cast(counted.c.handled, BigInteger).label("handled"),
        cast(counted.c.satisfied, BigInteger).label("satisfied"),
        cast(counted.c.tolerating, BigInteger).label("tolerating"),
        slots.label("fleet_slots"),
    ).select_from(counted)


def _end(
    table: Table,
    column: ColumnElement[object],
    where: ColumnElement[bool] | None = None,
    *,
    newest: bool = False,
) -> ColumnElement[object]:
    """``column`` of the row with the lowest id (``newest``: the highest) among those meeting
    ``where``: one step into an index from its end."""
    stmt = select(column).order_by(table.c.id.desc() if newest else table.c.id).limit(1)
    if where is not None:
        stmt = stmt.where(where)
    return stmt.scalar_subquery()


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
