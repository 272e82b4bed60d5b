"""When an idle worker looks for work next (``outbox._engine.wake_schedule``): no database."""

from __future__ import annotations

from outbox._engine.wake_schedule import DUE_MARGIN_SECONDS, MAX_DUE_NOTED, WakeSchedule


def test_with_nothing_noted_the_wait_is_the_interval_jittered_by_half() -> None:
    """An idle worker waits between half and one and a half of its interval."""
    waits = [WakeSchedule().poll_timeout(10.0) for _ in range(200)]
    assert (True, True) == (min(waits) >= 5.0, max(waits) <= 15.0)


def test_a_group_due_already_makes_the_worker_look_again_at_once() -> None:
    """A group noted due now is looked for after the margin only, not the interval."""
    wakes = WakeSchedule()
    wakes.note_due(0.0)
    assert DUE_MARGIN_SECONDS == wakes.poll_timeout(60.0)


def test_a_group_due_soon_shortens_the_wait_to_just_after_it() -> None:
    """A group due in a second is looked for a little after that second, not at the interval."""
    wakes = WakeSchedule()
    wakes.note_due(1.0)
    wait = wakes.poll_timeout(60.0)
    assert (True, True) == (wait <= 1.0 + DUE_MARGIN_SECONDS, wait > 0.9)


def test_the_due_times_noted_stay_bounded() -> None:
    """A backlog of retries keeps at most the soonest due times, not one per group."""
    wakes = WakeSchedule()
    for n in range(MAX_DUE_NOTED + 1):
        wakes.note_due(100.0 + n)
    wait = wakes.poll_timeout(1000.0)
    assert (True, True) == (wait <= 100.0 + DUE_MARGIN_SECONDS, len(wakes._due) <= MAX_DUE_NOTED)


def test_a_turn_beyond_the_longest_wait_is_not_waited_for() -> None:
    """A rate limit's turn later than a held group may wait is none of the burst run's."""
    wakes = WakeSchedule()
    wakes.note_turn(10.0)
    assert None is wakes.next_turn(5.0)


def test_a_turn_within_the_longest_wait_is_waited_for_until_just_after_it() -> None:
    """A turn due within the wait is waited for, a margin after it is due."""
    wakes = WakeSchedule()
    wakes.note_turn(2.0)
    turn = wakes.next_turn(5.0)
    assert turn is not None
    assert (True, True) == (turn <= 2.0 + DUE_MARGIN_SECONDS, turn > 1.9)
