"""outbox_handlers.distributed_tick: any number of schedulers calling distribution on the same
tick; exactly one takes it for each handler.

A tick is taken by one conditional UPDATE that moves the handler's tick forward (its row
inserted first when missing); the row count tells the caller whether it won. Sessions racing
for one tick behind a barrier, on real connections: one wins, the others find the tick taken,
whether the handler's row existed or not.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from outbox._db import queries
from tests.conformance._database import EXPECTED_LOCK_WAIT_SECONDS, THREAD_SECONDS, Database
from tests.conformance._factories import HANDLER, OTHER_HANDLER, add_batch_job, add_claim_job

TICK = 1_798_000_000_000
"""A tick, named by its start in milliseconds since the epoch."""
CALLERS = 8


def _take(db: Database, tick: int, handler: str = HANDLER) -> bool:
    """Take a tick as a caller does: the row made first, in its own transaction, if missing."""
    won = db.run(lambda conn: queries.take_distribution_tick(conn, handler, tick))
    if won is None:
        db.run(lambda conn: queries.ensure_handler_row(conn, db.dialect, handler))
        won = db.run(lambda conn: queries.take_distribution_tick(conn, handler, tick))
    return bool(won)


def _ticks(db: Database) -> dict[str, int | None]:
    return db.run(queries.distributed_ticks)


def test_a_handler_without_a_row_is_told_apart_from_a_tick_taken(db: Database) -> None:
    """No row yet: the tick is not taken, and the answer says the row is missing."""
    assert (None, {}) == (
        db.run(lambda conn: queries.take_distribution_tick(conn, HANDLER, TICK)),
        _ticks(db),
    )


def test_the_first_caller_of_a_tick_takes_it_and_records_it(db: Database) -> None:
    """No row yet: the row is made and the tick recorded; the caller won."""
    assert (True, {HANDLER: TICK}) == (_take(db, TICK), _ticks(db))


def test_a_second_caller_of_the_same_tick_loses(db: Database) -> None:
    """The tick is taken: the second caller learns it, and the tick stays."""
    _take(db, TICK)
    assert (False, {HANDLER: TICK}) == (_take(db, TICK), _ticks(db))


def test_a_later_tick_is_taken_again(db: Database) -> None:
    """The next tick moves the handler's tick forward."""
    _take(db, TICK)
    assert (True, {HANDLER: TICK + 60_000}) == (_take(db, TICK + 60_000), _ticks(db))


def test_an_older_tick_loses_to_a_newer_one_taken(db: Database) -> None:
    """A caller late with an older tick finds a newer one taken: it loses, the newer stays."""
    _take(db, TICK + 1_000)
    assert (False, {HANDLER: TICK + 1_000}) == (_take(db, TICK), _ticks(db))


def test_a_tick_is_taken_for_each_handler_on_its_own(db: Database) -> None:
    """One handler's tick taken leaves the other's free."""
    _take(db, TICK)
    assert (True, {HANDLER: TICK, OTHER_HANDLER: TICK}) == (
        _take(db, TICK, OTHER_HANDLER),
        _ticks(db),
    )


def test_taking_a_tick_leaves_a_pause_as_it_was(db: Database) -> None:
    """The tick shares the handler's row with its pause: taking one does not lift it."""
    db.run(
        lambda conn: queries.pause_handler(
            conn, db.dialect, HANDLER, seconds=None, cause="operator", reason="test"
        )
    )
    _take(db, TICK)
    assert True is db.run(queries.handler_states)[HANDLER].paused


def _race(db: Database, tick: int) -> list[bool]:
    """``CALLERS`` sessions, each on a connection of its own, take ``tick`` at once."""
    engines = [db.other_engine(EXPECTED_LOCK_WAIT_SECONDS) for _ in range(CALLERS)]
    connections = [engine.connect() for engine in engines]
    barrier = threading.Barrier(CALLERS, timeout=THREAD_SECONDS)

    def take(n: int) -> bool:
        conn = connections[n]
        barrier.wait()
        with conn.begin():
            won = queries.take_distribution_tick(conn, HANDLER, tick)
        if won is None:
            with conn.begin():
                queries.ensure_handler_row(conn, db.dialect, HANDLER)
            with conn.begin():
                won = queries.take_distribution_tick(conn, HANDLER, tick)
        return bool(won)

    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            return list(pool.map(take, range(CALLERS), timeout=THREAD_SECONDS))
    finally:
        for conn in connections:
            conn.close()


@pytest.mark.parametrize("row", ["missing", "present"])
def test_callers_racing_for_one_tick_give_exactly_one_winner(db: Database, row: str) -> None:
    """Eight sessions behind a barrier, on real connections: one takes the tick, seven lose,
    whether the handler's row was there or each had to make it."""
    if row == "present":
        _take(db, TICK - 60_000)
    won = _race(db, TICK)
    assert (1, CALLERS - 1, {HANDLER: TICK}) == (won.count(True), won.count(False), _ticks(db))


# --- when the next job is due ------------------------------------------------------------------


def _next_due(db: Database, handlers: list[str] | None = None) -> float | None:
    return db.run(lambda conn: queries.next_job_due(conn, handlers or [HANDLER]))


def test_nothing_is_due_without_jobs(db: Database) -> None:
    """No job waits: None."""
    assert None is _next_due(db)


def test_a_job_due_already_is_due_now(db: Database) -> None:
    """A job past its due time: 0, never a negative number."""
    add_batch_job(db.engine, due_in=-30.0)
    assert 0.0 == _next_due(db)


def test_the_soonest_job_to_come_says_when(db: Database) -> None:
    """Jobs due later: the seconds until the soonest."""
    add_batch_job(db.engine, due_in=300.0)
    add_claim_job(db.engine, 0, due_in=30.0)
    due = _next_due(db) or 0.0
    assert (True, True) == (25.0 < due, due <= 30.0)


def test_another_handlers_jobs_do_not_count(db: Database) -> None:
    """Only the handlers asked about."""
    add_batch_job(db.engine, handler=OTHER_HANDLER, due_in=-1.0)
    assert None is _next_due(db)


def test_a_paused_handlers_jobs_do_not_count(db: Database) -> None:
    """Nothing may run them while the pause lasts."""
    add_batch_job(db.engine, due_in=-1.0)
    db.run(
        lambda conn: queries.pause_handler(
            conn, db.dialect, HANDLER, seconds=None, cause="operator", reason="test"
        )
    )
    assert None is _next_due(db)
