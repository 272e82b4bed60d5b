"""Several rate limits on one handler, all kept at once: an API that limits each account and
the whole client. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from outbox import Batch, ConfigurationError, Outbox, RateLimit, RetryAfter
from outbox._engine.completion import pauses_on_retry_after
from outbox.ops import flow, metrics
from outbox.testing import drain
from outbox.worker import Worker
from tests.integration.test_rate_limits import NO_WAIT, most_in_any_window
from tests.models import ActivityEvent

Commit = Callable[..., list[int]]


def test_a_fleet_limit_and_a_per_account_limit_are_both_kept(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Four accounts, each allowed 2 calls a second, the client 5: no second holds more than
    5 calls, nor more than 2 of one account (with the account's limit alone, 8 would go)."""
    app = make_app(database_url)
    starts: list[tuple[float, int]] = []
    lock = threading.Lock()

    @app.handler(
        ActivityEvent,
        batch_size=1,
        retry=NO_WAIT,
        rate_limit=[RateLimit(calls=5), RateLimit(calls=2, key="activity_id")],
    )
    def bulk(batch: Batch[ActivityEvent]) -> None:
        with lock:
            starts.append((time.monotonic(), batch.events[0].activity_id))

    for account in range(4):
        commit_events(app.engine, 3, activity_id=account)
    Worker(app, concurrency=8, burst=True).run()
    every = [at for at, _ in starts]
    per_account = [
        most_in_any_window(mine, [1] * len(mine))
        for account in range(4)
        for mine in [[at for at, a in starts if a == account]]
    ]
    assert (12, True, [True] * 4) == (
        len(starts),
        most_in_any_window(every, [1] * 12) <= 5,
        [most <= 2 for most in per_account],
    )


def test_rate_limit_key_applies_to_the_limits_that_name_no_key(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    limits = [RateLimit(calls=10), RateLimit(events=500, key="kind")]
    app.handler(
        ActivityEvent, name="h", batch_size=100, rate_limit=limits, rate_limit_key="activity_id"
    )(lambda batch: None)
    keys = [limit.key for limit in app.get_handler("h").rate_limits]
    (status,) = metrics.collect(app)
    assert (["activity_id", "kind"], ["10 calls/s per activity_id", "500 events/s per kind"]) == (
        keys,
        status.rate_limits,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": [RateLimit(calls=1), 3]}, "rate_limit must be RateLimit, a sequence"),
        ({"rate_limit": RateLimit(calls=1, key="nope")}, "rate_limit's key must name a column"),
        ({"rate_limit": RateLimit(calls=1, key="group_id")}, "rate_limit's key must name"),
        ({"rate_limit": RateLimit(events=50)}, "rate_limit allows 50 events in 1 s, fewer"),
        ({"rate_limit": [], "rate_limit_key": "kind"}, "rate_limit_key needs a rate_limit"),
    ],
)
def test_bad_limits_are_refused_at_registration(options: dict[str, object], message: str) -> None:
    app = Outbox("sqlite://")
    with pytest.raises(ConfigurationError, match=rf"^handler 'h': {message}"):
        app.handler(ActivityEvent, name="h", batch_size=100, **options)(lambda b: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "pauses"),
    [
        (None, True),
        ([RateLimit(calls=5)], True),
        ([RateLimit(calls=5), RateLimit(calls=2, key="activity_id")], True),
        ([RateLimit(calls=2, key="activity_id"), RateLimit(events=100, key="kind")], False),
    ],
)
def test_a_retry_after_pauses_the_handler_unless_every_limit_is_per_key(
    limits: list[RateLimit] | None, pauses: bool
) -> None:
    app = Outbox("sqlite://")
    app.handler(ActivityEvent, name="h", batch_size=100, rate_limit=limits)(lambda b: None)
    assert pauses == pauses_on_retry_after(app.get_handler("h"))


def test_a_retry_after_under_a_fleet_and_a_per_key_limit_pauses_the_handler(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """The fleet-wide limit may be what the downstream refused: the whole handler waits."""
    app = make_app(database_url)

    @app.handler(
        ActivityEvent,
        name="h",
        batch_size=5,
        retry=NO_WAIT,
        rate_limit=[RateLimit(calls=100), RateLimit(calls=50, key="activity_id")],
    )
    def refused(batch: Batch[ActivityEvent]) -> None:
        raise RetryAfter(30, reason="429: the client is over its quota")

    commit_events(app.engine, 1, activity_id=1)
    drain(app)
    assert ["h"] == list(flow.paused(app))
