"""The statements distribution sends for many handlers at once: which buffers have a row
unclaimed (one UNION ALL of index probes), the claim jobs of many handlers, and one tick taken
for many handlers by a locking read and one UPDATE. Sessions racing for one tick over
overlapping handlers, in opposite orders, on real connections: one wins each handler, and none
deadlocks."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest
from sqlalchemy import Table

from outbox._db import queries
from outbox._db.queries import distribution
from tests.conformance._database import EXPECTED_LOCK_WAIT_SECONDS, THREAD_SECONDS, Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    add_batch_job,
    add_claim_job,
    add_events,
)
from tests.models import EmailEvent, SinkEvent

EMAIL = cast(Table, EmailEvent.__table__)
SINK = cast(Table, SinkEvent.__table__)
TICK = 1_798_000_000_000
CALLERS = 6
NAMES = [f"handler-{n}" for n in range(5)]


@pytest.mark.parametrize("per_statement", [1, 2, 200])
def test_tables_with_unclaimed_are_those_with_a_row_no_group_holds(
    db: Database, monkeypatch: pytest.MonkeyPatch, per_statement: int
) -> None:
    """A buffer with an unclaimed row is found; one empty, or whose rows are all claimed, is
    not; whether the probes share one statement or not."""
    monkeypatch.setattr(distribution, "PROBES_PER_STATEMENT", per_statement)
    add_events(db.engine, 2, table=EMAIL)
    add_events(db.engine, 3, group_id=uuid.uuid4())
    found = db.run(lambda conn: queries.tables_with_unclaimed(conn, [ACTIVITY, EMAIL, SINK]))
    assert {EMAIL} == found


def test_claim_jobs_pending_counts_claim_jobs_of_the_handlers_asked_about(db: Database) -> None:
    """Claim jobs by handler; batch jobs and the handlers not asked about are left out."""
    add_claim_job(db.engine, 0)
    add_claim_job(db.engine, 1)
    add_batch_job(db.engine)
    add_claim_job(db.engine, 0, handler=OTHER_HANDLER)
    assert {HANDLER: 2} == db.run(
        lambda conn: queries.claim_jobs_pending(conn, [HANDLER, "no-jobs"])
    )


def _take(db: Database, names: list[str], tick: int) -> tuple[list[str], list[str]]:
    return db.run(lambda conn: queries.take_distribution_ticks(conn, names, tick))


def test_ticks_are_taken_for_the_handlers_with_a_row_and_the_others_named(db: Database) -> None:
    """The handlers with a row and an older tick are won; a second caller of the tick wins
    none; the handlers with no row are named, their tick not taken."""
    db.run(lambda conn: queries.ensure_handler_row(conn, db.dialect, HANDLER))
    first = _take(db, [HANDLER, OTHER_HANDLER], TICK)
    second = _take(db, [HANDLER], TICK)
    later = _take(db, [HANDLER], TICK + 1)
    assert (([HANDLER], [OTHER_HANDLER]), ([], []), ([HANDLER], []), {HANDLER: TICK + 1}) == (
        first,
        second,
        later,
        db.run(queries.distributed_ticks),
    )


def test_callers_racing_for_one_tick_over_many_handlers_give_one_winner_each(
    db: Database,
) -> None:
    """Six sessions behind a barrier take one tick for overlapping sets of handlers, named in
    opposite orders: each handler is won once, and no session deadlocks."""
    for name in NAMES:
        db.run(lambda conn, name=name: queries.ensure_handler_row(conn, db.dialect, name))
    engines = [db.other_engine(EXPECTED_LOCK_WAIT_SECONDS) for _ in range(CALLERS)]
    connections = [engine.connect() for engine in engines]
    barrier = threading.Barrier(CALLERS, timeout=THREAD_SECONDS)

    def take(n: int) -> list[str]:
        names = NAMES[n % 2 :] if n % 3 else list(reversed(NAMES))
        conn = connections[n]
        barrier.wait()
        with conn.begin():
            won, _ = queries.take_distribution_ticks(conn, names, TICK)
        return won

    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            won = list(pool.map(take, range(CALLERS), timeout=THREAD_SECONDS))
    finally:
        for conn in connections:
            conn.close()
    assert (sorted(NAMES), dict.fromkeys(NAMES, TICK)) == (
        sorted(name for names in won for name in names),
        db.run(queries.distributed_ticks),
    )
