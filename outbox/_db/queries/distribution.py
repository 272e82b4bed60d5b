"""Statements distribution sends for many handlers at once, so that what one tick costs follows
the buffers with events waiting rather than every buffer there is: which buffers have
unclaimed rows, the claim jobs pending for many handlers, and one tick taken for many
handlers."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

from sqlalchemy import (
    Connection,
    Dialect,
    Integer,
    Table,
    func,
    literal_column,
    select,
    union_all,
    update,
)

from outbox import schema

_jobs = schema.jobs
_handlers = schema.handlers

PROBES_PER_STATEMENT = 200
"""Buffers one statement looks into: below SQLite's limit of 500 terms in a compound SELECT, and
few enough to keep PostgreSQL's planning in proportion: 1,000 buffers took it 1.4 s to plan in
one statement, 0.2 s in five of 200 (planning a union grows faster than its terms)."""


def tables_with_unclaimed(conn: Connection, tables: Sequence[Table]) -> set[Table]:
    """The tables of ``tables`` where any row waits unclaimed.

    One probe per table, as :func:`outbox._db.queries.any_unclaimed` makes it (the first
    entry of the partial index ``ix_<table>_unclaimed``: ORDER BY id keeps the planner on it),
    joined by UNION ALL into one statement per :data:`PROBES_PER_STATEMENT` tables: an empty
    buffer costs the server its probe's planning and one index probe, and the caller no round
    trip of its own. A table that does not exist fails the whole statement (the caller finds
    out which one apart).
    """
    found: set[Table] = set()
    for start in range(0, len(tables), PROBES_PER_STATEMENT):
        chunk = tuple(tables[start : start + PROBES_PER_STATEMENT])
        rows = conn.exec_driver_sql(_probe_text(conn.dialect, chunk))
        found.update(chunk[int(i)] for (i,) in rows)
    return found


@functools.lru_cache(maxsize=256)
def _probe_text(dialect: Dialect, tables: tuple[Table, ...]) -> str:
    """The probe of ``tables`` as the database's SQL, made once: built and compiled each time,
    a statement of 200 subqueries cost the caller about 25 ms of CPU, more than the database
    spent on it. Its values are written in (``literal_binds``): the text is the statement."""
    probes = [
        select(literal_column(str(i), Integer).label("i")).select_from(
            select(table.c.id)
            .where(table.c.group_id.is_(None))
            .order_by(table.c.id)
            .limit(1)
            .subquery(f"probe_{i}")
        )
        for i, table in enumerate(tables)
    ]
    statement = probes[0] if len(probes) == 1 else union_all(*probes)
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def claim_jobs_pending(conn: Connection, handlers: Collection[str]) -> dict[str, int]:
    """The claim jobs (pending or running) of each of ``handlers`` that has any: one statement,
    through the index ``uq_outbox_jobs_claim_slot (handler, slot)``."""
    if not handlers:
        return {}
    rows = conn.execute(
        select(_jobs.c.handler, func.count())
        .where(_jobs.c.handler.in_(sorted(handlers)), _jobs.c.kind == schema.JobKind.CLAIM)
        .group_by(_jobs.c.handler)
    )
    return {str(handler): int(count) for handler, count in rows}


def take_distribution_ticks(
    conn: Connection, names: Collection[str], tick: int
) -> tuple[list[str], list[str]]:
    """Take the distribution tick ``tick`` for many handlers at once: (the handlers whose
    ``distributed_tick`` this caller moved forward to it, those that have no row yet).

    What :func:`outbox._db.queries.take_distribution_tick` decides for one handler, for all of
    them in two statements: a locking read of their rows, in the order of their primary key
    (two callers lock shared rows in one order, so they wait on each other rather than
    deadlock), then one UPDATE of the rows whose tick is older. The locking read sees the tick
    a concurrent caller committed (PostgreSQL's ``FOR UPDATE`` reads the newest row version
    once the lock is its; InnoDB's locking read sees the latest committed one; SQLite's
    transaction holds the write lock from BEGIN), so that of any number of callers of a
    tick, one moves each handler's tick. The rows stay locked until the transaction ends:
    commit at once.
    """
    if not names:
        return [], []
    rows = conn.execute(
        select(_handlers.c.name, _handlers.c.distributed_tick)
        .where(_handlers.c.name.in_(sorted(names)))
        .order_by(_handlers.c.name)
        .with_for_update()
    )
    found = {str(name): taken for name, taken in rows}
    won = sorted(name for name, taken in found.items() if taken is None or int(taken) < tick)
    if won:
        conn.execute(
            update(_handlers).where(_handlers.c.name.in_(won)).values(distributed_tick=tick)
        )
    return won, sorted(set(names) - set(found))
