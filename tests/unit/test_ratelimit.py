"""RateLimit: its windows, its words, and the settings it refuses at construction."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, RateLimit
from outbox.ratelimit import Unit, Window


@pytest.mark.parametrize(
    ("limit", "windows"),
    [
        # Calls evenly spaced by default: a spacing window of one call.
        (
            RateLimit(calls=100, per=60),
            (Window(Unit.CALLS, 100, 60.0), Window(Unit.CALLS, 1, 0.6, exact=False)),
        ),
        (RateLimit(events=4000), (Window(Unit.EVENTS, 4000, 1.0),)),
        (
            RateLimit(calls_per_second=10),
            (Window(Unit.CALLS, 10, 1.0), Window(Unit.CALLS, 1, 0.1, exact=False)),
        ),
        (
            RateLimit(calls_per_second=4.5),
            (Window(Unit.CALLS, 4, 1.0), Window(Unit.CALLS, 1, 0.25, exact=False)),
        ),
        (RateLimit(calls_per_second=0.05), (Window(Unit.CALLS, 1, 20.0),)),
        (
            RateLimit(calls=10, burst=2),
            (Window(Unit.CALLS, 10, 1.0), Window(Unit.CALLS, 2, 0.2, exact=False)),
        ),
        (RateLimit(calls=10, burst=10), (Window(Unit.CALLS, 10, 1.0),)),
    ],
)
def test_a_limit_keeps_its_windows(limit: RateLimit, windows: tuple[Window, ...]) -> None:
    assert windows == limit.windows()


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        (RateLimit(calls=100, per=60, key="account_id"), "100 calls/min per account_id"),
        (RateLimit(calls_per_second=9, events_per_second=4000, event_burst=500),
         "9 calls/s; 4000 events/s, burst 500"),
        (RateLimit(calls_per_second=0.05), "1 call per 20 s"),
    ],
)  # fmt: skip
def test_a_limit_says_itself_in_words(limit: RateLimit, words: str) -> None:
    assert words == limit.describe()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"calls": 0}, "calls"),
        ({"events": 2.5}, "events"),
        ({"calls": True}, "calls"),
        ({"calls": 1, "per": 0}, "per"),
        ({"calls": 1, "per": float("nan")}, "per"),
        ({"calls": 1, "calls_per_second": 1}, "calls"),
        ({"calls_per_second": 1, "per": 60}, "per"),
        ({"calls": 1, "event_burst": 2}, "event_burst"),
        ({"calls": 1, "key": ""}, "key"),
        ({"calls": 1, "key": 3}, "key"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^RateLimit\.{field} "):
        RateLimit(**options)  # type: ignore[arg-type]
