"""outbox_rate_limits: reserving calls under shared rate limits (sliding windows).

A reservation returns when, from the database's clock, the call may start: the earliest moment
at which the starts its window holds and its own cost fit the capacity, and not before the
limit's last reserved start. A wait longer than the caller's ``max_wait`` reserves nothing.
Two sessions reserving at once are served one after the other: the second waits for the
first's lock and is charged after it. Rows kept by the previous version (``tat`` alone, no
starts) keep their meaning: no call before ``tat``.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, select, update

from outbox import schema
from outbox._checks import MAX_WAIT_SECONDS
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from tests.conformance._database import THREAD_SECONDS, Database
from tests.conformance._factories import HANDLER, OTHER_HANDLER

# Two calls in any second.
CALLS = queries.Spend("calls", 1, 2, 1.0)
# How far two reservations of the same test may be apart in the database clock.
SLACK = 0.25
# SQLite keeps times to the millisecond, and its julianday() arithmetic in floating point; the
# starts are kept to a thousandth of their window, rounded up.
CLOCK_GRAIN = 0.003


def _reserve(conn: Connection, db: Database, *spends: queries.Spend, handler: str = HANDLER,
             max_wait: float = 60.0) -> float:  # fmt: skip
    spent = list(spends or [CALLS])
    return queries.reserve(conn, db.dialect, handler, spent, max_wait=max_wait).wait


def _waits(db: Database, count: int, *spends: queries.Spend, max_wait: float = 60.0) -> list[float]:
    return [
        db.run(lambda conn: _reserve(conn, db, *spends, max_wait=max_wait)) for _ in range(count)
    ]


def _near(actual: list[float], expected: list[float]) -> bool:
    return all(e - SLACK <= a <= e + CLOCK_GRAIN for a, e in zip(actual, expected, strict=True))


def test_a_window_lets_its_capacity_go_at_once_then_waits_for_the_oldest_to_leave(
    db: Database,
) -> None:
    waits = _waits(db, 3)
    assert _near(waits, [0.0, 0.0, 1.0]), waits


def test_a_call_is_charged_its_cost(db: Database) -> None:
    """Ten events of a capacity of fifteen in any second: the second group of ten waits for
    the first to leave the window, a group of five fits beside it."""
    ten = queries.Spend("events", 10, 15, 1.0)
    five = queries.Spend("events", 5, 15, 1.0)
    waits = [
        db.run(lambda conn, spend=spend: _reserve(conn, db, spend)) for spend in (ten, five, ten)
    ]
    assert _near(waits, [0.0, 0.0, 1.0]), waits


def test_a_call_costlier_than_the_capacity_waits_for_an_empty_window(db: Database) -> None:
    small = queries.Spend("events", 1, 5, 1.0)
    large = queries.Spend("events", 8, 5, 1.0)
    waits = [
        db.run(lambda conn, spend=spend: _reserve(conn, db, spend))
        for spend in (small, large, small)
    ]
    assert _near(waits, [0.0, 1.0, 2.0]), waits


def test_a_wait_past_max_wait_reserves_nothing(db: Database) -> None:
    """Asked with a max_wait shorter than its turn, a call is told the wait and charged
    nothing: the next call is told the same."""
    first = _waits(db, 2)
    refused = _waits(db, 2, max_wait=0.1)
    assert _near(first + refused, [0.0, 0.0, 1.0, 1.0]), (first, refused)


def test_the_strictest_limit_decides_and_every_limit_records_the_start(db: Database) -> None:
    """Calls allowed at once, events not: the call waits for the events, and the calls
    window counts it from when it starts (two calls alone then fit beside it, not three)."""
    calls = queries.Spend("calls", 1, 2, 1.0)
    events = queries.Spend("events", 10, 10, 1.0)
    waits = _waits(db, 2, calls, events)
    only_calls = _waits(db, 2, calls)
    assert _near([*waits, *only_calls], [0.0, 1.0, 1.0, 2.0]), (waits, only_calls)


def test_two_limits_of_one_row_keep_the_stricter(db: Database) -> None:
    loose = queries.Spend("calls", 1, 5, 1.0)
    strict = queries.Spend("calls", 1, 1, 1.0)
    waits = _waits(db, 2, loose, strict)
    assert _near(waits, [0.0, 1.0]), waits


def test_starts_only_move_forwards(db: Database) -> None:
    """A call that waited for its events limit: a later call of the calls limit alone is not
    put before it, though the calls window has room."""
    calls = queries.Spend("calls", 1, 10, 1.0)
    events = queries.Spend("events", 1, 1, 2.0)
    waits = _waits(db, 2, calls, events)
    only_calls = db.run(lambda conn: _reserve(conn, db, calls))
    assert _near([*waits, only_calls], [0.0, 2.0, 2.0]), (waits, only_calls)


def test_limits_are_per_handler(db: Database) -> None:
    first = _waits(db, 2)
    other = db.run(lambda conn: _reserve(conn, db, handler=OTHER_HANDLER))
    assert _near([*first, other], [0.0, 0.0, 0.0])


def test_a_second_session_waits_for_the_first_and_is_charged_after_it(
    row_locks: Database,
) -> None:
    db = row_locks
    one = queries.Spend("calls", 1, 1, 1.0)
    with db.other_engine().connect() as first:
        head = _reserve(first, db, one)
        second = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db, one)))
        db.wait_for_lock_waiter()
        waiting = not second.done()
        first.commit()
        after = second.result(THREAD_SECONDS)
    # Told the first's start plus the window, less the time it waited for the lock.
    assert (True, 0.0, True) == (waiting, head, 0.0 < after <= 1.0 + CLOCK_GRAIN), after


def test_a_session_that_waited_for_the_lock_reserves_from_when_it_got_it(
    row_locks: Database,
) -> None:
    """The first session holds the lock for half a second and more with the window full: the
    second is told to wait a second less the time it waited, by the database's clock."""
    db = row_locks
    one = queries.Spend("calls", 1, 1, 1.0)
    with db.other_engine().connect() as first:
        _reserve(first, db, one)
        second = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db, one)))
        db.wait_for_lock_waiter()
        time.sleep(0.5)  # the lock is held while the database's clock goes on
        first.commit()
        after = second.result(THREAD_SECONDS)
    assert 0.0 < after <= 0.5 + CLOCK_GRAIN, after


def test_a_turn_reports_the_local_clock_around_the_databases_read(db: Database) -> None:
    before = time.monotonic()
    turn = db.run(lambda conn: queries.reserve(conn, db.dialect, HANDLER, [CALLS], max_wait=1))
    after = time.monotonic()
    assert (True, True) == (turn.reserved, before <= turn.asked_at <= turn.told_at <= after)


def test_holding_a_limit_back_delays_its_next_call_and_no_other(db: Database) -> None:
    """A key's Retry-After of 5 s: that key's next call may start in 5 s though its window has
    room, another key's at once."""
    held = queries.Spend("calls@account:1", 1, 5, 1.0)
    other = queries.Spend("calls@account:2", 1, 5, 1.0)
    db.run(lambda conn: _reserve(conn, db, held))
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [held.key], 5.0))
    waits = [db.run(lambda conn, spend=spend: _reserve(conn, db, spend)) for spend in (held, other)]
    assert _near(waits, [5.0, 0.0]), waits


def test_holding_a_limit_back_never_brings_its_turn_forward(db: Database) -> None:
    """A limit held for 10 s, then for 2 s: its next call still waits 10 s."""
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 10.0))
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 2.0))
    waits = _waits(db, 1)
    assert _near(waits, [10.0]), waits


def test_a_row_of_the_previous_version_keeps_its_next_start(db: Database) -> None:
    """A row with a theoretical arrival time 3 s off and no starts: the next call waits 3 s,
    then the window counts it."""
    with db.engine.begin() as conn:
        conn.execute(
            schema.rate_limits.insert().values(handler=HANDLER, key="calls", tat=db_now_plus(3))
        )
    waits = _waits(db, 3)
    assert _near(waits, [3.0, 3.0, 4.0]), waits


def test_a_limits_turn_is_never_put_more_than_a_year_off(db: Database) -> None:
    """A hold of ten years holds a year at most, which every database stores: the next call
    waits that year, not nothing."""
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 1e12))
    wait = db.run(lambda conn: _reserve(conn, db))
    assert MAX_WAIT_SECONDS - 5 < wait <= MAX_WAIT_SECONDS


def test_a_long_window_keeps_its_starts_past_the_idle_time(db: Database) -> None:
    """A day's window: its row is not forgotten an hour after its last start."""
    daily = queries.Spend("calls/86400s", 1, 1, 86_400.0)
    db.run(lambda conn: _reserve(conn, db, daily))
    with db.engine.begin() as conn:
        conn.execute(update(schema.rate_limits).values(tat=db_now_plus(-7200)))
    deleted = db.run(lambda conn: queries.delete_idle_limits(conn, 3600))
    wait = db.run(lambda conn: _reserve(conn, db, daily, max_wait=10**6))
    # Its start is kept to a thousandth of the window, rounded up.
    assert (0, True) == (deleted, 86_000 < wait <= 86_400 * 1.001 + 1), wait


def test_idle_limits_are_forgotten_and_made_again(db: Database) -> None:
    """A limit whose last start and window passed long ago is deleted; a recent one stays; a
    reservation after the deletion starts from an empty window."""
    db.run(lambda conn: _reserve(conn, db))
    db.run(lambda conn: _reserve(conn, db, handler=OTHER_HANDLER))
    with db.engine.begin() as conn:
        conn.execute(
            update(schema.rate_limits)
            .where(schema.rate_limits.c.handler == HANDLER)
            .values(tat=db_now_plus(-7200), starts=None, starts_until=db_now_plus(-7200))
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
    limit waits for it, then makes the row again and reserves from an empty window."""
    db = row_locks
    db.run(lambda conn: _reserve(conn, db))
    with db.engine.begin() as conn:
        conn.execute(
            update(schema.rate_limits).values(
                tat=db_now_plus(-7200), starts=None, starts_until=None
            )
        )
    with db.other_engine().connect() as prune:
        deleted = queries.delete_idle_limits(prune, 3600)
        reservation = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db)))
        db.wait_for_lock_waiter()
        prune.commit()
        wait = reservation.result(THREAD_SECONDS)
    with db.engine.connect() as conn:
        rows = conn.execute(select(schema.rate_limits.c.key)).scalars().all()
    assert (1, 0.0, ["calls"]) == (deleted, wait, rows)


def test_a_call_its_own_key_holds_back_is_not_reserved_and_holds_no_other_key(
    db: Database,
) -> None:
    """A fleet-wide limit with room and an account's limit without: the account's call is not
    reserved (it goes back for its key's wait), and the fleet-wide limit keeps no start of it,
    so that another account's call goes at once. Before, the reserved start became the fleet's
    latest, and every account queued behind one account's window."""
    fleet = queries.Spend("calls", 1, 10, 1.0)

    def account(name: str) -> queries.Spend:
        return queries.Spend(f"calls@account:{name}", 1, 1, 1.0, per_key=True)

    def turn(*spends: queries.Spend) -> queries.Turn:
        return db.run(lambda conn: queries.reserve(conn, db.dialect, HANDLER, spends, max_wait=60))

    first = turn(fleet, account("a"))
    held = turn(fleet, account("a"))
    other = turn(fleet, account("b"))
    assert (first.reserved, first.wait) == (True, 0.0)
    assert held.reserved is False
    assert 1.0 - SLACK <= held.wait <= 1.0 + CLOCK_GRAIN, held.wait
    assert (other.reserved, other.wait) == (True, 0.0)
