"""The supervisor's restart backoff: a worker that keeps dying young waits longer each time."""

from __future__ import annotations

from outbox.cli._signals import (
    MAX_RESTART_DELAY_SECONDS,
    RESTART_DELAY_SECONDS,
    STEADY_SECONDS,
    _restart_delay,
)


def test_a_worker_dying_young_backs_off_up_to_the_cap_and_starts_over_after_a_steady_run() -> None:
    """Delays double per early death up to the cap; one steady run resets them."""
    delays = {0: RESTART_DELAY_SECONDS, 1: RESTART_DELAY_SECONDS}

    young = [_restart_delay(delays, 0, lived=0.5) for _ in range(7)]
    other = _restart_delay(delays, 1, lived=0.5)
    after_steady = _restart_delay(delays, 0, lived=STEADY_SECONDS)

    assert ([1.0, 2.0, 4.0, 8.0, 16.0, MAX_RESTART_DELAY_SECONDS, 30.0], 1.0, 1.0) == (
        young,
        other,
        after_steady,
    )
