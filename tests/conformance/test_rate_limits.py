"""outbox_rate_limits: reserving calls under a shared rate limit (GCRA).

A reservation returns the seconds until the call may start: calls are spaced by the interval
(cost x seconds per unit), a tolerance lets that many seconds of calls go early, and a wait
longer than the caller's ``max_wait`` reserves nothing. Two sessions reserving at once are
served one after the other: the second waits for the first's lock and is charged after it.
"""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from outbox import schema
from outbox._checks import MAX_WAIT_SECONDS
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from tests.conformance._database import THREAD_SECONDS, Database
from tests.conformance._factories import HANDLER, OTHER_HANDLER

CALLS = queries.Spend("calls", 1, 0.5, 0.0)
# How far two reservations of the same test may be apart in the database clock.
SLACK = 0.25
# SQLite keeps times to the millisecond, and its julianday() arithmetic in floating point.
CLOCK_GRAIN = 0.002


def _reserve(conn: Connection, db: Database, *spends: queries.Spend, handler: str = HANDLER,
             max_wait: float = 60.0) -> float:  # fmt: skip
    return queries.reserve(conn, db.dialect, handler, list(spends or [CALLS]), max_wait=max_wait)


def _waits(db: Database, count: int, *spends: queries.Spend, max_wait: float = 60.0) -> list[float]:
    return [
        db.run(lambda conn: _reserve(conn, db, *spends, max_wait=max_wait)) for _ in range(count)
    ]


def _near(actual: list[float], expected: list[float]) -> bool:
    return all(e - SLACK <= a <= e + CLOCK_GRAIN for a, e in zip(actual, expected, strict=True))


def test_calls_are_spaced_by_the_interval(db: Database) -> None:
    waits = _waits(db, 3)
    assert _near(waits, [0.0, 0.5, 1.0]), waits


def test_a_tolerance_lets_that_many_seconds_of_calls_go_at_once(db: Database) -> None:
    """A burst of three calls (a tolerance of two intervals): three at once, then spaced."""
    burst = queries.Spend("calls", 1, 0.5, 1.0)
    waits = _waits(db, 4, burst)
    assert _near(waits, [0.0, 0.0, 0.0, 0.5]), waits


def test_a_call_is_charged_its_cost(db: Database) -> None:
    """Ten events at a tenth of a second each: the next call waits a second."""
    events = queries.Spend("events", 10, 0.1, 0.0)
    waits = _waits(db, 2, events)
    assert _near(waits, [0.0, 1.0]), waits


def test_a_wait_past_max_wait_reserves_nothing(db: Database) -> None:
    """Asked with a max_wait shorter than its turn, a call is told the wait and charged
    nothing: the next call is told the same."""
    first = _waits(db, 1)
    refused = _waits(db, 2, max_wait=0.1)
    assert _near(first + refused, [0.0, 0.5, 0.5]), (first, refused)


def test_the_strictest_limit_decides_and_charges_every_limit_from_then(db: Database) -> None:
    """Calls allowed at once, events not: the call waits for the events, and the calls limit
    is charged from when it starts."""
    calls = queries.Spend("calls", 1, 0.1, 0.0)
    events = queries.Spend("events", 10, 0.1, 0.0)
    waits = _waits(db, 2, calls, events)
    only_calls = db.run(lambda conn: _reserve(conn, db, calls))
    assert _near([*waits, only_calls], [0.0, 1.0, 1.1]), (waits, only_calls)


def test_limits_are_per_handler(db: Database) -> None:
    first = db.run(lambda conn: _reserve(conn, db))
    other = db.run(lambda conn: _reserve(conn, db, handler=OTHER_HANDLER))
    assert _near([first, other], [0.0, 0.0])


def test_a_second_session_waits_for_the_first_and_is_charged_after_it(
    row_locks: Database,
) -> None:
    db = row_locks
    with db.other_engine().connect() as first:
        head = _reserve(first, db)
        second = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db)))
        db.wait_for_lock_waiter()
        waiting = not second.done()
        first.commit()
        after = second.result(THREAD_SECONDS)
    assert (True, True) == (waiting, _near([head, after], [0.0, 0.5])), (head, after)


def test_holding_a_limit_back_delays_its_next_call_and_no_other(db: Database) -> None:
    """A key's Retry-After of 5 s: that key's next call may start in 5 s (a burst's tolerance
    does not shorten it), another key's at once."""
    burst = queries.Spend("calls:1", 1, 0.5, 1.0)
    other = queries.Spend("calls:2", 1, 0.5, 1.0)
    db.run(lambda conn: _reserve(conn, db, burst))
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [burst], 5.0))
    held = db.run(lambda conn: _reserve(conn, db, burst))
    free = db.run(lambda conn: _reserve(conn, db, other))
    assert _near([held, free], [5.0, 0.0]), (held, free)


def test_holding_a_limit_back_never_brings_its_turn_forward(db: Database) -> None:
    """Twenty calls reserved: the limit's turn is 10 s off, and a hold of 2 s leaves it there."""
    _waits(db, 20)
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS], 2.0))
    waits = _waits(db, 1)
    assert _near(waits, [10.0]), waits


def test_a_limits_turn_is_never_put_more_than_a_year_off(db: Database) -> None:
    """A call charged ten years (a huge group under a slow limit) moves the turn a year on at
    most, which every database stores: the next call waits that year, not nothing."""
    costly = queries.Spend("events", 10 * 366 * 86_400, 1.0, 0.0)
    db.run(lambda conn: _reserve(conn, db, costly))
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS], 1e12))
    waits = [
        db.run(lambda conn: _reserve(conn, db, costly)),
        db.run(lambda conn: _reserve(conn, db, CALLS)),
    ]
    assert [True, True] == [MAX_WAIT_SECONDS - 5 < wait <= MAX_WAIT_SECONDS for wait in waits]


def test_idle_limits_are_forgotten_and_made_again(db: Database) -> None:
    """A limit whose turn passed long ago is deleted; a recent one stays; a reservation after
    the deletion starts from a full budget."""
    db.run(lambda conn: _reserve(conn, db))
    db.run(lambda conn: _reserve(conn, db, handler=OTHER_HANDLER))
    with db.engine.begin() as conn:
        conn.execute(
            update(schema.rate_limits)
            .where(schema.rate_limits.c.handler == HANDLER)
            .values(tat=db_now_plus(-7200))
        )
    deleted = db.run(lambda conn: queries.delete_idle_limits(conn, 3600))
    with db.engine.connect() as conn:
        left = conn.execute(select(schema.rate_limits.c.handler)).scalars().all()
    again = db.run(lambda conn: _reserve(conn, db))
    assert (1, [OTHER_HANDLER], 0.0) == (deleted, left, again)


def test_a_reservation_outlasts_a_prune_of_its_row_at_the_same_time(
    row_locks: Database,
) -> None:
    """A prune deletes an idle limit's row and has not committed; a reservation of the same
    limit waits for it, then makes the row again and reserves from a full budget."""
    db = row_locks
    db.run(lambda conn: _reserve(conn, db))
    with db.engine.begin() as conn:
        conn.execute(update(schema.rate_limits).values(tat=db_now_plus(-7200)))
    with db.other_engine().connect() as prune:
        deleted = queries.delete_idle_limits(prune, 3600)
        reservation = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db)))
        db.wait_for_lock_waiter()
        prune.commit()
        wait = reservation.result(THREAD_SECONDS)
    with db.engine.connect() as conn:
        rows = conn.execute(select(schema.rate_limits.c.key)).scalars().all()
    assert (1, 0.0, ["calls"]) == (deleted, wait, rows)
