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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, event, select, update

from outbox import schema
from outbox._core.checks import MAX_WAIT_SECONDS
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox._db.queries.limits import GRAIN_PER_WINDOW
from tests.conformance._database import THREAD_SECONDS, Database
from tests.conformance._factories import HANDLER, OTHER_HANDLER

# Two calls in any second.
CALLS = queries.Spend("calls", 1, 2, 1.0)
# SQLite keeps times to the millisecond, and its julianday() arithmetic in floating point; the
# starts are kept to a thousandth of their window, rounded up: a start may be told that far
# either side of its model's.
CLOCK_GRAIN = 0.003
# A window far longer than any delay between a test's calls, for calls that must still be
# refused, or still wait, however late they ask; its starts are told to a thousandth of it.
LONG_WINDOW = 60.0
LONG_GRAIN = CLOCK_GRAIN + LONG_WINDOW / GRAIN_PER_WINDOW

# The tests check each call's start against a model: a call starts at the later of its slot and
# when it asked (a call that asks after its slot starts at once). Slots are seconds after the
# test's first call read the database's clock (or after a timed statement, ``since``), and a
# call's reservation reads that clock some time between its turn's ``asked_at`` and
# ``told_at``: the local clock bounds when each call asked and started, whatever the delays
# between reservations on a loaded machine.


@dataclass(frozen=True)
class _After:
    """A slot ``seconds`` after the start of the test's ``call``-th call (from 0): one that
    asked late, and so started late, moves it."""

    call: int
    seconds: float


@dataclass(frozen=True)
class _Moment:
    """When a statement read the database's clock, between these two readings of the local
    clock (``time.monotonic()``)."""

    earliest: float
    latest: float


def _reserve(conn: Connection, db: Database, *spends: queries.Spend, handler: str = HANDLER,
             max_wait: float = 60.0) -> queries.Turn:  # fmt: skip
    spent = list(spends or [CALLS])
    return queries.reserve(conn, db.dialect, handler, spent, max_wait=max_wait)


def _turns(
    db: Database, count: int, *spends: queries.Spend, max_wait: float = 60.0
) -> list[queries.Turn]:
    return [
        db.run(lambda conn: _reserve(conn, db, *spends, max_wait=max_wait)) for _ in range(count)
    ]


def _timed(db: Database, work: Callable[[Connection], object]) -> _Moment:
    """Run ``work`` in one transaction: when its statements read the database's clock."""
    earliest = time.monotonic()
    db.run(work)
    return _Moment(earliest, time.monotonic())


def _asked(turns: Sequence[queries.Turn], since: _Moment | None) -> list[tuple[float, float]]:
    """When each call read the database's clock, earliest and latest, in seconds after
    ``since`` (by default the first call's read, which is then exactly 0)."""
    if since is None:
        first = turns[0]
        return [(0.0, 0.0), *_asked(turns[1:], _Moment(first.asked_at, first.told_at))]
    return [(turn.asked_at - since.latest, turn.told_at - since.earliest) for turn in turns]


def _on_time(
    turns: Sequence[queries.Turn],
    slots: Sequence[float | _After],
    since: _Moment | None = None,
    grain: float = CLOCK_GRAIN,
) -> bool:
    """Whether each call was told to start at the later of its slot and when it asked, to
    ``grain`` seconds."""
    starts: list[tuple[float, float]] = []
    kept = True
    for turn, (early, late), slot in zip(turns, _asked(turns, since), slots, strict=True):
        if isinstance(slot, _After):
            after = starts[slot.call]
            first, last = after[0] + slot.seconds, after[1] + slot.seconds
        else:
            first = last = slot
        # Told to wait until its slot from when it asked, or not at all once that is past.
        wait_least, wait_most = max(first - late, 0.0), max(last - early, 0.0)
        kept &= wait_least - grain <= turn.wait <= wait_most + grain
        starts.append((early + turn.wait, late + turn.wait))
    return kept


def _timeline(turns: Sequence[queries.Turn], since: _Moment | None = None) -> list[str]:
    """When each call asked and was told to start, for a failure's message."""
    return [
        f"asked {(early + late) / 2:.3f}, starts {(early + late) / 2 + turn.wait:.3f}"
        for turn, (early, late) in zip(turns, _asked(turns, since), strict=True)
    ]


def test_a_window_lets_its_capacity_go_at_once_then_waits_for_the_oldest_to_leave(
    db: Database,
) -> None:
    turns = _turns(db, 3)
    assert _on_time(turns, [0.0, 0.0, 1.0]), _timeline(turns)


def test_a_call_is_charged_its_cost(db: Database) -> None:
    """Ten events of a capacity of fifteen in any second: the second group of ten waits for
    the first to leave the window, a group of five fits beside it."""
    ten = queries.Spend("events", 10, 15, 1.0)
    five = queries.Spend("events", 5, 15, 1.0)
    turns = [
        db.run(lambda conn, spend=spend: _reserve(conn, db, spend)) for spend in (ten, five, ten)
    ]
    assert _on_time(turns, [0.0, 0.0, 1.0]), _timeline(turns)


def test_a_call_costlier_than_the_capacity_waits_for_an_empty_window(db: Database) -> None:
    small = queries.Spend("events", 1, 5, 1.0)
    large = queries.Spend("events", 8, 5, 1.0)
    turns = [
        db.run(lambda conn, spend=spend: _reserve(conn, db, spend))
        for spend in (small, large, small)
    ]
    # The last small call waits for the large one to leave the window: 2.0 s.
    assert _on_time(turns, [0.0, 1.0, _After(1, 1.0)]), _timeline(turns)


def test_a_wait_past_max_wait_reserves_nothing(db: Database) -> None:
    """Asked with a max_wait shorter than its turn, a call is told its start and charged
    nothing: the next call is told the same."""
    one = queries.Spend("calls", 1, 1, LONG_WINDOW)
    first = _turns(db, 1, one)
    refused = _turns(db, 2, one, max_wait=0.1)
    turns = [*first, *refused]
    assert ([False, False], True) == (
        [turn.reserved for turn in refused],
        _on_time(turns, [0.0, LONG_WINDOW, LONG_WINDOW], grain=LONG_GRAIN),
    ), _timeline(turns)


def test_the_strictest_limit_decides_and_every_limit_records_the_start(db: Database) -> None:
    """Calls allowed at once, events not: the call waits for the events, and the calls
    window counts it from when it starts (two calls alone then fit beside it, not three)."""
    calls = queries.Spend("calls", 1, 2, 1.0)
    events = queries.Spend("events", 10, 10, 1.0)
    turns = [*_turns(db, 2, calls, events), *_turns(db, 2, calls)]
    # The calls alone: one with the second call (1.0 s), one a window after it (2.0 s).
    assert _on_time(turns, [0.0, 1.0, _After(1, 0.0), _After(1, 1.0)]), _timeline(turns)


def test_two_limits_of_one_row_keep_the_stricter(db: Database) -> None:
    loose = queries.Spend("calls", 1, 5, 1.0)
    strict = queries.Spend("calls", 1, 1, 1.0)
    turns = _turns(db, 2, loose, strict)
    assert _on_time(turns, [0.0, 1.0]), _timeline(turns)


def test_starts_only_move_forwards(db: Database) -> None:
    """A call that waited for its events limit: a later call of the calls limit alone is not
    put before it, though the calls window has room."""
    calls = queries.Spend("calls", 1, 10, 1.0)
    events = queries.Spend("events", 1, 1, 2.0)
    turns = [*_turns(db, 2, calls, events), *_turns(db, 1, calls)]
    assert _on_time(turns, [0.0, 2.0, _After(1, 0.0)]), _timeline(turns)


def test_a_reservation_records_its_start_however_long_it_takes_to_write_it(
    db: Database,
) -> None:
    """Calls of a limit held for 3 s may start together when the hold ends: the second is told
    the first's start, though the first took 0.3 s between reading the clock and writing."""

    def slow_write(conn: Connection, cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("UPDATE OUTBOX_RATE_LIMITS"):
            time.sleep(0.3)  # a process held up between the reservation's statements

    calls = queries.Spend("calls", 1, 10, 1.0)
    hold = _timed(db, lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [calls.key], 3.0))
    event.listen(db.engine, "before_cursor_execute", slow_write)
    turns = _turns(db, 2, calls)
    assert _on_time(turns, [3.0, _After(0, 0.0)], since=hold), _timeline(turns, hold)


def test_limits_are_per_handler(db: Database) -> None:
    turns = [*_turns(db, 2), db.run(lambda conn: _reserve(conn, db, handler=OTHER_HANDLER))]
    assert _on_time(turns, [0.0, 0.0, 0.0]), _timeline(turns)


def test_a_second_session_waits_for_the_first_and_is_charged_after_it(
    row_locks: Database,
) -> None:
    db = row_locks
    one = queries.Spend("calls", 1, 1, LONG_WINDOW)
    with db.other_engine().connect() as first:
        head = _reserve(first, db, one)
        second = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db, one)))
        db.wait_for_lock_waiter()
        waiting = not second.done()
        first.commit()
        turns = [head, second.result(THREAD_SECONDS)]
    slots_kept = _on_time(turns, [0.0, LONG_WINDOW], grain=LONG_GRAIN)
    assert (True, True) == (waiting, slots_kept), _timeline(turns)


def test_a_session_that_waited_for_the_lock_reserves_from_when_it_got_it(
    row_locks: Database,
) -> None:
    """The first session holds the lock for half a second and more with the window full: the
    second reads the database's clock once it got the lock, and is told the first's start
    plus the window from then."""
    db = row_locks
    one = queries.Spend("calls", 1, 1, LONG_WINDOW)
    with db.other_engine().connect() as first:
        head = _reserve(first, db, one)
        second = db.in_thread(lambda: db.run(lambda conn: _reserve(conn, db, one)))
        db.wait_for_lock_waiter()
        time.sleep(0.5)  # the lock is held while the database's clock goes on
        released = time.monotonic()
        first.commit()
        turns = [head, second.result(THREAD_SECONDS)]
    asked_after = released <= turns[1].asked_at
    slots_kept = _on_time(turns, [0.0, LONG_WINDOW], grain=LONG_GRAIN)
    assert (True, True) == (asked_after, slots_kept), _timeline(turns)


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
    hold = _timed(db, lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [held.key], 5.0))
    turns = [db.run(lambda conn, spend=spend: _reserve(conn, db, spend)) for spend in (held, other)]
    assert _on_time(turns, [5.0, 0.0], since=hold), _timeline(turns, hold)


def test_holding_a_limit_back_never_brings_its_turn_forward(db: Database) -> None:
    """A limit held for 10 s, then for 2 s: its next call still waits 10 s."""
    hold = _timed(db, lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 10.0))
    db.run(lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 2.0))
    turns = _turns(db, 1)
    assert _on_time(turns, [10.0], since=hold), _timeline(turns, hold)


def test_a_row_of_the_previous_version_keeps_its_next_start(db: Database) -> None:
    """A row with a theoretical arrival time 3 s off and no starts: the next call waits 3 s,
    then the window counts it."""
    row = schema.rate_limits.insert().values(handler=HANDLER, key="calls", tat=db_now_plus(3))
    written = _timed(db, lambda conn: conn.execute(row))
    turns = _turns(db, 3)
    # The second call goes with the first (3.0 s), the third a window after it (4.0 s).
    slots = [3.0, _After(0, 0.0), _After(0, 1.0)]
    assert _on_time(turns, slots, since=written), _timeline(turns, written)


def test_a_limits_turn_is_never_put_more_than_a_year_off(db: Database) -> None:
    """A hold of ten years holds a year at most, which every database stores: the next call
    waits that year, not nothing."""
    hold = _timed(db, lambda conn: queries.hold_back(conn, db.dialect, HANDLER, [CALLS.key], 1e12))
    turns = _turns(db, 1)
    assert _on_time(turns, [MAX_WAIT_SECONDS], since=hold), _timeline(turns, hold)


def test_a_long_window_keeps_its_starts_past_the_idle_time(db: Database) -> None:
    """A day's window: its row is not forgotten an hour after its last start."""
    daily = queries.Spend("calls/86400s", 1, 1, 86_400.0)
    db.run(lambda conn: _reserve(conn, db, daily))
    with db.engine.begin() as conn:
        conn.execute(update(schema.rate_limits).values(tat=db_now_plus(-7200)))
    deleted = db.run(lambda conn: queries.delete_idle_limits(conn, 3600))
    wait = db.run(lambda conn: _reserve(conn, db, daily, max_wait=10**6)).wait
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
    again = db.run(lambda conn: _reserve(conn, db)).wait
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
        wait = reservation.result(THREAD_SECONDS).wait
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
        return queries.Spend(f"calls@account:{name}", 1, 1, LONG_WINDOW, per_key=True)

    def call(*spends: queries.Spend) -> queries.Turn:
        # A max_wait past the account's window: only its key's wait sends the call back.
        return db.run(lambda conn: _reserve(conn, db, *spends, max_wait=2 * LONG_WINDOW))

    turns = [call(fleet, account("a")), call(fleet, account("a")), call(fleet, account("b"))]
    assert ([True, False, True], True) == (
        [turn.reserved for turn in turns],
        _on_time(turns, [0.0, LONG_WINDOW, 0.0], grain=LONG_GRAIN),
    ), _timeline(turns)
