"""Desired workers, drain time and Apdex from what the scaling read found: the arithmetic of
outbox.ops.scaling, and the worker's count of events delivered in time."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import replace
from typing import Any

import pytest

from outbox import ConfigurationError, Outbox, RateLimit, Urgency
from outbox._db.types import ScalingRow
from outbox._services.throughput import timeliness
from outbox.ops.scaling import plan, read_scaling
from outbox.results import SUCCEEDED, BatchResult
from tests.models import ActivityEvent, EmailEvent

EMPTY = ScalingRow(
    handler="",
    first_unclaimed=None,
    last_unclaimed=None,
    newest_unclaimed_age=None,
    first_id=None,
    last_id=None,
    oldest_age=None,
    runnable_groups=0,
    live_leases=0,
    paused=False,
    recent_handled=0,
    recent_seconds=0.0,
    recent_busy=0.0,
    busy_handled=0,
    handled=0,
    satisfied=0,
    tolerating=0,
    fleet_slots=4,
)


def _app(**options: Any) -> Outbox:
    app = Outbox("sqlite://")
    app.handler(ActivityEvent, name="fast", urgency=Urgency.REALTIME, batch_size=100, **options)(
        lambda batch: None
    )
    app.handler(EmailEvent, name="slow", urgency=Urgency.DAY, batch_size=100)(lambda batch: None)
    return app


def _waiting(handler: str, events: int, **more: Any) -> ScalingRow:
    """``events`` unclaimed rows written at 10 a second until now, and 100 events a second
    handled by one slot over the last minute."""
    values: dict[str, Any] = {
        "handler": handler,
        "first_unclaimed": 1 if events else None,
        "last_unclaimed": events if events else None,
        "newest_unclaimed_age": 0.0 if events else None,
        "first_id": 1 if events else None,
        "last_id": events if events else None,
        "oldest_age": events / 10 if events else None,
        "recent_handled": 6000,
        "recent_seconds": 60.0,
        "recent_busy": 60.0,
        "busy_handled": 6000,
    }
    return replace(EMPTY, **{**values, **more})


def _plan(app: Outbox, *rows: ScalingRow) -> Any:
    return plan(list(app.handlers.values()), list(rows))


def test_a_backlog_asks_for_the_slots_that_keep_up_and_drain_it_in_half_its_promise() -> None:
    """11,700 REALTIME events arriving at 10 a second, 100 a second a slot: the newest handled
    within 30 s asks for 11,700 / 30 / 100 = 3.9, 4 slots (the arrivals of the next 30 s
    within a minute, (11,700 + 300) / 60 / 100, fewer); the DAY band with nothing waiting asks
    for none; the fleet's 4 slots drain it in 117 slot-seconds / 4."""
    found = _plan(_app(), _waiting("fast", 11_700), _waiting("slow", 0))
    assert (4, [4, 0], 29.25, 11_700) == (
        found.desired_workers,
        [b.desired_workers for b in found.bands],
        found.drain_seconds,
        found.runnable,
    )


def test_the_newest_events_age_shortens_the_horizon() -> None:
    """The same backlog, whose newest event already waited 20 s, has 10 s left of half a
    minute: 1,170 / 100, 12 slots."""
    found = _plan(
        _app(),
        _waiting("fast", 11_700, newest_unclaimed_age=20.0, oldest_age=1_190.0),
        _waiting("slow", 0),
    )
    assert 12 == found.desired_workers


def test_rows_written_much_faster_than_handled_are_a_backlog_not_a_rate() -> None:
    """A backfill of 3,000 events written at once, with 100 a second handled: no arrivals to
    keep up with, only a backlog to drain, 3,000 / 30 s / 100 = 1 slot."""
    backfill = _waiting("fast", 3000, newest_unclaimed_age=0.0, oldest_age=0.0)
    found = _plan(_app(), backfill, _waiting("slow", 0))
    assert (0.0, 1) == (found.handlers[0].arrival_rate, found.desired_workers)


def test_rows_written_about_as_fast_as_handled_are_a_rate_to_plan_for() -> None:
    """3,000 events waiting, written over the last 20 s, 100 a second handled: 150 a second
    arrive, and those of the autoscaler's lag (30 s) are handled within 30 s too: (3,000 +
    4,500) / 60 / 100 = 1.25, 2 slots, where the backlog alone asks for 1."""
    stream = _waiting("fast", 3000, newest_unclaimed_age=0.0, oldest_age=20.0)
    found = _plan(_app(), stream, _waiting("slow", 0))
    assert (150.0, 1.25, 2) == (
        found.handlers[0].arrival_rate,
        found.handlers[0].slots,
        found.desired_workers,
    )


def test_a_stream_outgrowing_the_fleet_asks_for_more_only_once_its_backlog_would_be_late() -> None:
    """150 a second arriving, one slot handling 100: with 150 waiting, one slot still handles
    all that arrives over the autoscaler's lag within 30 s ((150 + 4,500) / 60 = 77.5 a
    second); with 3,000 waiting it does not, and two are asked for."""
    young = _waiting("fast", 150, newest_unclaimed_age=0.0, oldest_age=1.0)
    grown = _waiting("fast", 3000, newest_unclaimed_age=0.0, oldest_age=20.0)
    asked = [_plan(_app(), row, _waiting("slow", 0)).desired_workers for row in (young, grown)]
    assert [1, 2] == asked


def test_a_paused_handler_is_no_demand() -> None:
    """Its events wait for the pause to end, not for workers."""
    found = _plan(_app(), _waiting("fast", 12_000, paused=True), _waiting("slow", 0))
    assert (0, 0) == (found.desired_workers, found.runnable)


def test_deferred_groups_are_no_demand_and_due_ones_are() -> None:
    """Claimed rows whose batch jobs are not due (no runnable group) ask for nothing; two due
    groups of 100 ask for a slot."""
    claimed = replace(_waiting("fast", 0), first_id=1, last_id=200, oldest_age=3.0)
    deferred = _plan(_app(), claimed, _waiting("slow", 0))
    due = _plan(_app(), replace(claimed, runnable_groups=2), _waiting("slow", 0))
    assert ((0, 0), (1, 200)) == (
        (deferred.desired_workers, deferred.runnable),
        (due.desired_workers, due.runnable),
    )


def test_a_live_lease_keeps_one_slot_asked_for() -> None:
    """Nothing runnable, one group in flight: one slot, not none."""
    found = _plan(_app(), _waiting("fast", 0, live_leases=1), _waiting("slow", 0))
    assert (1, [1, 0]) == (found.desired_workers, [b.desired_workers for b in found.bands])


def test_a_handler_never_measured_asks_for_one_slot() -> None:
    """Without a rate, a slot comes first and measures it; the drain time is not known."""
    found = _plan(
        _app(),
        _waiting(
            "fast", 12_000, recent_handled=0, recent_seconds=0.0, recent_busy=0.0, busy_handled=0
        ),
        _waiting("slow", 0),
    )
    assert (1, None) == (found.desired_workers, found.drain_seconds)


def test_the_rate_of_a_slot_is_what_was_handled_over_the_slots_busy_seconds() -> None:
    """6,000 events in 240 busy slot-seconds: 25 a slot a second, so (10 + 11,700 / 30) / 25
    = 16 slots."""
    row = _waiting("fast", 11_700, recent_busy=240.0)
    found = _plan(_app(), row, _waiting("slow", 0))
    assert (25.0, 16) == (found.handlers[0].rate_per_slot, found.desired_workers)


def test_the_rate_of_a_slot_after_an_idle_spell_is_its_busy_rate() -> None:
    """Two minutes in which 1,200 events took 12 busy slot-seconds, mostly idle, with 4 slots
    in flight now after a scale-up: a slot does 100 a second, not 1,200 / 120 s / 4 = 2.5."""
    row = _waiting(
        "fast",
        11_700,
        recent_handled=1200,
        recent_seconds=120.0,
        recent_busy=12.0,
        busy_handled=1200,
        live_leases=4,
    )
    found = _plan(_app(), row, _waiting("slow", 0))
    assert (100.0, 4) == (found.handlers[0].rate_per_slot, found.desired_workers)


def test_without_busy_time_the_rate_of_a_slot_is_the_handlers_over_its_slots_in_flight() -> None:
    """Minutes of workers that keep no busy time: 6,000 events a minute by 4 slots in flight
    are 25 a slot a second."""
    row = _waiting("fast", 11_700, recent_busy=0.0, busy_handled=0, live_leases=4)
    found = _plan(_app(), row, _waiting("slow", 0))
    assert 25.0 == found.handlers[0].rate_per_slot


def test_a_concurrency_cap_bounds_the_slots() -> None:
    """A handler capped at 2 groups in flight never asks for more than 2 slots."""
    found = _plan(_app(concurrency=2), _waiting("fast", 12_000), _waiting("slow", 0))
    assert 2 == found.desired_workers


def test_a_fleet_wide_rate_limit_bounds_the_slots() -> None:
    """One call of 100 events a second keeps one slot of 100 events a second busy: no more."""
    found = _plan(
        _app(rate_limit=RateLimit(calls=1)), _waiting("fast", 12_000), _waiting("slow", 0)
    )
    assert 1 == found.desired_workers


def test_a_batch_not_yet_full_before_max_wait_is_no_demand() -> None:
    """50 events of a size-or-time handler (batch 100, max_wait 60 s) that waited 5 s are not
    due yet; once the oldest waited 60 s they are."""
    early = _plan(_app(max_wait=60.0), _waiting("fast", 50), _waiting("slow", 0))
    late = _plan(_app(max_wait=60.0), _waiting("fast", 50, oldest_age=61.0), _waiting("slow", 0))
    assert (0, 50) == (early.runnable, late.runnable)


def test_apdex_counts_tolerating_events_at_half_weight() -> None:
    """80 satisfied, 10 tolerating, 10 frustrated of 100: (80 + 5) / 100."""
    row = _waiting("fast", 0, handled=100, satisfied=80, tolerating=10)
    found = _plan(_app(), row, _waiting("slow", 0))
    assert (0.85, None) == (found.bands[0].apdex, found.bands[1].apdex)


def test_bands_drain_in_order_of_urgency() -> None:
    """The DAY band drains after the REALTIME one: its drain time counts both."""
    found = _plan(_app(), _waiting("fast", 12_000), _waiting("slow", 24_000))
    assert [30.0, 90.0] == [b.drain_seconds for b in found.bands]


def test_workers_for_rounds_slots_up_to_whole_processes() -> None:
    """Ten slots ((10 + 29,700 / 30) / 100) are three workers of four."""
    found = _plan(_app(), _waiting("fast", 29_700), _waiting("slow", 0))
    assert (10, 3) == (found.desired_workers, found.workers_for(4))


@pytest.mark.parametrize(
    ("option", "value"), [("target", 0), ("target", 1.5), ("rate_window", 10), ("apdex_window", -1)]
)
def test_out_of_bounds_options_are_refused_naming_them(option: str, value: float) -> None:
    """A target outside (0, 1] or a window shorter than a minute is refused before any read."""
    with pytest.raises(ConfigurationError, match=option):
        read_scaling(_app(), **{option: value})


def _result(ages: list[float], succeeded: int, promise: float = 60.0) -> BatchResult:
    end = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    return BatchResult(
        handler="fast",
        group_id=uuid.uuid4(),
        attempt=1,
        outcome=SUCCEEDED,
        size=len(ages),
        succeeded=succeeded,
        created_at=tuple(end - dt.timedelta(seconds=age) for age in ages),
        finished_at=end,
        promise=promise,
    )


def test_events_are_satisfied_within_the_promise_and_tolerating_within_four_times() -> None:
    """Ages 10 s and 60 s satisfy a minute's promise, 61 s and 240 s tolerate, 241 s does not."""
    assert (2, 2) == timeliness(_result([10.0, 60.0, 61.0, 240.0, 241.0], succeeded=5))


def test_undelivered_events_are_taken_from_the_satisfied_first() -> None:
    """Of a group of one young and two late events, one delivered: counted as a late one."""
    assert (0, 1) == timeliness(_result([5.0, 100.0, 100.0], succeeded=1))


def test_naive_creation_times_are_read_as_utc() -> None:
    """SQLite's naive times compare as UTC with the batch's end."""
    result = _result([30.0, 90.0], succeeded=2)
    naive = replace(result, created_at=tuple(c.replace(tzinfo=None) for c in result.created_at))
    assert (1, 1) == timeliness(naive)


def test_bands_come_in_order_of_priority_not_of_promise() -> None:
    """A NIGHTLY band of a shorter promise but a later priority than DAY drains after it."""
    app = Outbox("sqlite://")
    nightly = Urgency("NIGHTLY", priority=35, promise=43_200.0)
    app.handler(ActivityEvent, name="fast", urgency=nightly, batch_size=100)(lambda batch: None)
    app.handler(EmailEvent, name="slow", urgency=Urgency.DAY, batch_size=100)(lambda batch: None)
    found = _plan(app, _waiting("fast", 12_000), _waiting("slow", 24_000))
    assert [("DAY", 60.0), ("NIGHTLY", 90.0)] == [(b.urgency, b.drain_seconds) for b in found.bands]
