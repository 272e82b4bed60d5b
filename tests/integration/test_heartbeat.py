"""A worker's heartbeat: how often it beats, and when it may take another worker for gone.

A worker judges others gone (and rescues their jobs before their leases end) only once its own
heartbeats have been steady for a whole stale age: after a database outage every worker was
silent, and the first one back must not take the others for dead.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox import Outbox, Settings
from outbox._services.heartbeat import Heartbeat, heartbeat_interval

STALE = 6.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _heartbeat(app: Outbox, clock: _Clock) -> Heartbeat:
    return Heartbeat(app, "w1", 1, running=list, stopping=lambda: False, clock=clock)


def _app(make_app: Callable[[str], Outbox], url: str) -> Outbox:
    app = make_app(url)
    app.with_settings(lease_seconds=60.0, worker_stale_after=STALE)
    return app


def test_heartbeats_come_every_third_of_the_shorter_of_lease_and_stale_age() -> None:
    """Three heartbeats per stale age (or per lease, when that is shorter)."""
    assert (2.0, 1.0) == (
        heartbeat_interval(Settings(lease_seconds=60.0, worker_stale_after=6.0)),
        heartbeat_interval(Settings(lease_seconds=3.0, worker_stale_after=60.0)),
    )


def test_a_worker_judges_others_once_its_heartbeats_were_steady_for_the_stale_age(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Beating every interval: not before a stale age has passed since the first beat, then yes."""
    clock = _Clock()
    beat = _heartbeat(_app(make_app, database_url), clock)
    judged = []
    for _ in range(4):
        beat.run_once()
        judged.append(beat.may_judge_others())
        clock.now += 2.0
    assert [False, False, False, True] == judged


def test_a_gap_in_its_own_heartbeats_starts_the_count_again(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A worker that could not beat for a while (an outage) judges no one until it has been
    steady for a stale age again; nor while its own last beat is overdue."""
    clock = _Clock()
    beat = _heartbeat(_app(make_app, database_url), clock)
    for _ in range(4):
        beat.run_once()
        clock.now += 2.0
    steady = beat.may_judge_others()
    clock.now += 10.0
    overdue = beat.may_judge_others()
    beat.run_once()
    after_gap = beat.may_judge_others()
    assert (True, False, False) == (steady, overdue, after_gap)


def test_a_worker_knows_how_long_until_it_may_judge_others(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """None before its first beat; then the rest of a stale age; 0 once it may; None once its
    own last beat is overdue."""
    clock = _Clock()
    beat = _heartbeat(_app(make_app, database_url), clock)
    before = beat.judges_in()
    beat.run_once()
    clock.now += 2.0
    beat.run_once()
    steadying = beat.judges_in()
    clock.now += 2.0
    beat.run_once()
    clock.now += 2.0
    beat.run_once()
    steady = beat.judges_in()
    clock.now += 10.0
    assert (None, STALE - 2.0, 0.0, None) == (before, steadying, steady, beat.judges_in())
