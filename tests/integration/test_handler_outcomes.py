"""What a handler passes is checked where it passes it, and nothing outbox does after the
handler returned makes it run again: a bad value fails the handler's own attempt with that
error; a failure of outbox's own bookkeeping holds the group with the real error. On SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from outbox import Batch, Outbox, RetryAfter, RetryPolicy, Settings, schema
from outbox._engine import batch_job
from outbox.cli import main
from outbox.ops import holds, metrics
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent

NO_WAIT = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)

Commit = Callable[..., list[int]]


def _archived(app: Outbox) -> list[tuple[str, str]]:
    with app.engine.connect() as conn:
        rows = conn.execute(select(schema.archive.c.status, schema.archive.c.error))
        return sorted((status, (error or "").splitlines()[0]) for status, error in rows)


def _work_until(worker: Worker, done: Callable[[], bool]) -> None:
    """Run ``worker`` in a thread until ``done()``, then stop it."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(done, "the handler's calls", timeout=15)
    finally:
        worker.stop()
        thread.join(10)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def _discard_a_dict(batch: Batch[ActivityEvent]) -> None:
    batch.discard(batch.events, {"code": 422})  # type: ignore[arg-type]


def _retry_an_unprintable(batch: Batch[ActivityEvent]) -> None:
    batch.retry(batch.events, _Unprintable())  # type: ignore[arg-type]


def _discard_then_retry(batch: Batch[ActivityEvent]) -> None:
    batch.discard(batch.events[:1], "invalid email")
    batch.retry(batch.events, "rate limited")


def _retry_after_a_dict(batch: Batch[ActivityEvent]) -> None:
    batch.retry(batch.events, "429", after={"seconds": 5})  # type: ignore[arg-type]


def _retry_after_with_a_dict_reason(batch: Batch[ActivityEvent]) -> None:
    raise RetryAfter(5, reason={"code": 429})  # type: ignore[arg-type]


def _retry_after_a_naive_datetime(batch: Batch[ActivityEvent]) -> None:
    import datetime as dt

    raise RetryAfter(dt.datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (_discard_a_dict, "TypeError: batch.discard: reason must be a str, got dict"),
        (_retry_an_unprintable, "TypeError: batch.retry: reason must be a str, got _Unprintable"),
        (
            _discard_then_retry,
            "ValueError: batch.retry: events [1] were already discarded in this call; "
            "an event is either retried or discarded",
        ),
        (
            _retry_after_a_dict,
            "TypeError: batch.retry: after must be seconds, a timedelta, an aware datetime or "
            "Retry-After text, got dict",
        ),
        (
            _retry_after_with_a_dict_reason,
            "TypeError: RetryAfter: reason must be a str or None, got dict",
        ),
        (
            _retry_after_a_naive_datetime,
            "ValueError: RetryAfter: after: a datetime given to outbox needs a time zone: "
            "datetime.datetime(2030, 1, 1, 0, 0)",
        ),
    ],
)
def test_a_bad_value_fails_the_handlers_own_attempt_with_that_error(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    call: Callable[[Batch[ActivityEvent]], None],
    error: str,
) -> None:
    """Before, ``batch.discard(events, {"code": 422})`` was accepted; the completion then
    raised, the group sat in flight for its lease, was sent three times and died as "lease
    expired". Now each attempt fails once, at the call, and the group dies with that error."""
    app = make_app(database_url)
    attempts: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, retry=NO_WAIT, archive=True)
    def sink(batch: Batch[ActivityEvent]) -> None:
        attempts.append(batch.attempt)
        call(batch)

    commit_events(app.engine, 2)
    result = drain(app)
    assert attempts == [1, 2]
    assert (result.stats.groups_retried, result.stats.groups_dead) == (1, 1)
    assert _archived(app) == [("dead", error)] * 2


def test_outboxs_own_bookkeeping_failing_holds_the_group_and_never_runs_the_handler_again(
    database_url: str,
    make_app: Callable[..., Outbox],
    commit_events: Commit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should recording what the handler did fail inside outbox (not the database), the
    group is held as refused with the real error and traceback: not rescued and handed over
    again as a "lease expired", not reported as a success; status counts it and a burst
    run exits 1."""
    app = make_app(database_url)
    calls: list[list[int]] = []

    @app.handler(ActivityEvent, batch_size=10, retry=NO_WAIT)
    def sink(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.ids)

    def broken(*args: Any) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'dict'")

    monkeypatch.setattr(batch_job, "finish_succeeded", broken)
    module = types.ModuleType("outcomes_app")
    module.app = app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "outcomes_app", module)
    ids = commit_events(app.engine, 3)

    run = CliRunner().invoke(main, ["--app", "outcomes_app:app", "work", "--burst"])
    assert run.exit_code == 1, run.output
    assert "1 groups held as refused" in run.output
    drain(app)
    assert calls == [ids]
    (held,) = holds.refused_groups(app)
    assert held.error is not None
    assert held.error.startswith(
        "outbox could not record what the handler did: TypeError: unsupported operand"
    )
    assert "Traceback" in held.error
    assert "in broken" in held.error
    (status,) = metrics.collect(app)
    assert (status.groups_refused, status.claimed) == (1, 3)


def test_a_retry_after_of_zero_waits_the_floor_instead_of_hammering(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """``Retry-After: 0`` made one group call its downstream 101 times in 0.87 s and die of
    spent deferrals. With the default settings a deferral waits at least a second."""
    app = make_app(database_url, Settings(poll_interval=0.05))
    starts: list[float] = []

    @app.handler(ActivityEvent, batch_size=10)
    def limited(batch: Batch[ActivityEvent]) -> None:
        starts.append(time.monotonic())
        raise RetryAfter("0")

    commit_events(app.engine, 2)
    _work_until(Worker(app, concurrency=2, distribute_every=0.05), lambda: len(starts) >= 3)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.95, gaps


def test_a_deferred_group_comes_back_when_due_not_at_the_next_poll(
    database_url: str, make_app: Callable[..., Outbox], commit_events: Commit
) -> None:
    """``RetryAfter(5)`` came back after 6.4 to 7.0 s: the worker slept its poll. The worker
    that put a group off wakes when it is due; with a poll of 30 s it would be far later."""
    app = make_app(database_url, Settings(poll_interval=30, listen=False))
    starts: list[float] = []

    @app.handler(ActivityEvent, batch_size=10)
    def limited(batch: Batch[ActivityEvent]) -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise RetryAfter(1)

    commit_events(app.engine, 2)
    _work_until(Worker(app, concurrency=1, distribute_every=0.05), lambda: len(starts) >= 2)
    assert 1.0 <= starts[1] - starts[0] < 5, starts
