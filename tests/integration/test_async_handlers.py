"""Async handlers: delivered, retried, timed out (cancelled), concurrent, leased, shut down."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from outbox import Batch, Delivery, Outbox, RetryPolicy, Settings, schema
from outbox.results import BatchResult
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.handler_kinds import HANDLER_KINDS, HandlerKind, kind_id
from tests.models import ActivityEvent

# Retries due at once, so that a drain runs every attempt.
IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)
WAIT_SECONDS = 10.0


async def until(flag: threading.Event, timeout: float = WAIT_SECONDS) -> None:
    """In a coroutine: wait for a flag the test thread sets, without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not flag.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never set the flag")
        await asyncio.sleep(0.01)


class Calls:
    """What an async handler was given: (attempt, event ids) per call, thread-safe."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self._lock = threading.Lock()

    def record(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.calls.append((batch.attempt, list(batch.ids)))

    @property
    def handled(self) -> list[int]:
        return sorted(i for _, ids in self.calls for i in ids)


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    app = make_app(database_url)
    app.settings = Settings(poll_interval=0.05, rescue_interval=0.05)
    return app


@pytest.fixture
def running() -> Iterator[Callable[[Worker], list[bool]]]:
    """Run workers in threads; returns a list that receives run()'s result. Aborted after."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(worker: Worker) -> list[bool]:
        returned: list[bool] = []
        thread = threading.Thread(target=lambda: returned.append(worker.run()), daemon=True)
        thread.start()
        started.append((worker, thread))
        return returned

    yield start
    for worker, thread in started:
        worker.abort()
        thread.join(timeout=WAIT_SECONDS)


def buffer_ids(app: Outbox) -> list[int]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(ActivityEvent.id).order_by(ActivityEvent.id)).scalars())


def archived(app: Outbox) -> list[tuple[int, str]]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(schema.archive.c.event_id, schema.archive.c.status).order_by(
                schema.archive.c.event_id
            )
        )
        return [(int(event_id), status) for event_id, status in rows]


def batch_jobs(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.jobs).where(schema.jobs.c.kind == "batch")))


# --- delivery ----------------------------------------------------------------------------------


def test_async_handler_events_are_delivered(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """An async def handler runs to its end: every event reaches it, then leaves the buffer."""
    calls = Calls()

    @app.handler(ActivityEvent, batch_size=10)
    async def push(batch: Batch[ActivityEvent]) -> None:
        await asyncio.sleep(0)
        calls.record(batch)

    ids = commit_events(app.engine, 25)
    result = drain(app)
    assert (ids, [], 3) == (calls.handled, buffer_ids(app), result.stats.groups_succeeded)


@pytest.mark.parametrize("kind", HANDLER_KINDS, ids=kind_id)
def test_each_kind_of_handler_gets_every_event(
    app: Outbox, commit_events: Callable[..., list[int]], kind: HandlerKind
) -> None:
    """Functions, async functions, callable objects, partials, methods: each runs, each event."""
    calls = Calls()
    app.handler(ActivityEvent, name="kind", batch_size=4)(kind.build(calls.record))
    ids = commit_events(app.engine, 10)
    drain(app)
    assert (ids, []) == (calls.handled, buffer_ids(app))


def test_drain_runs_async_handlers_from_inside_a_running_event_loop(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """drain() called from a coroutine (an async test, an endpoint) runs async handlers."""
    calls = Calls()

    @app.handler(ActivityEvent, batch_size=10)
    async def push(batch: Batch[ActivityEvent]) -> None:
        await asyncio.sleep(0)
        calls.record(batch)

    async def test_body() -> int:
        return drain(app).stats.events_succeeded

    ids = commit_events(app.engine, 5)
    succeeded = asyncio.run(test_body())
    assert (ids, 5) == (calls.handled, succeeded)


# --- failure, timeout, partial outcomes ----------------------------------------------------------


def test_failing_async_handler_is_retried_then_dead_lettered(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """An async handler that raises fails its attempt: retried, then archived as dead."""
    calls = Calls()

    @app.handler(ActivityEvent, batch_size=10, retry=IMMEDIATE)
    async def push(batch: Batch[ActivityEvent]) -> None:
        calls.record(batch)
        await asyncio.sleep(0)
        raise LookupError("the downstream said no")

    ids = commit_events(app.engine, 3)
    drain(app)
    with app.engine.connect() as conn:
        errors = set(conn.execute(select(schema.archive.c.error)).scalars())
    assert ([1, 2, 3], [(i, "dead") for i in ids], True) == (
        [attempt for attempt, _ in calls.calls],
        archived(app),
        all(error.startswith("LookupError: the downstream said no") for error in errors),
    )


def test_async_handler_over_its_timeout_is_cancelled_and_its_group_retried(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Past its timeout the coroutine is cancelled (it sees CancelledError); the next attempt
    handles the group."""
    calls = Calls()
    cancelled = threading.Event()

    @app.handler(ActivityEvent, batch_size=10, timeout=0.2, retry=IMMEDIATE)
    async def push(batch: Batch[ActivityEvent]) -> None:
        if batch.attempt == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        calls.record(batch)

    ids = commit_events(app.engine, 3)
    result = drain(app)
    assert (True, [(2, ids)], 1, 1, []) == (
        cancelled.is_set(),
        calls.calls,
        result.stats.groups_retried,
        result.stats.groups_succeeded,
        buffer_ids(app),
    )


def test_at_most_once_async_handler_over_its_timeout_is_dead_lettered(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """At most once: a cancelled coroutine may have delivered, so its group is not run again."""
    attempts: list[int] = []

    @app.handler(
        ActivityEvent, batch_size=10, timeout=0.2, retry=IMMEDIATE, delivery=Delivery.AT_MOST_ONCE
    )
    async def charge(batch: Batch[ActivityEvent]) -> None:
        attempts.append(batch.attempt)
        await asyncio.Event().wait()

    ids = commit_events(app.engine, 2)
    drain(app)
    assert ([1], [(i, "dead") for i in ids]) == (attempts, archived(app))


def test_async_handler_retries_and_discards_single_events(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """batch.retry and batch.discard from an async handler: one event discarded, one retried
    alone as attempt 2, the rest succeeded."""
    calls = Calls()

    @app.handler(ActivityEvent, batch_size=10, retry=IMMEDIATE)
    async def push(batch: Batch[ActivityEvent]) -> None:
        await asyncio.sleep(0)
        calls.record(batch)
        if batch.attempt == 1:
            batch.discard(batch.events[:1], "invalid")
            batch.retry(batch.events[1:2], "rate limited")

    ids = commit_events(app.engine, 4)
    drain(app)
    assert ([(1, ids), (2, ids[1:2])], [(ids[0], "discarded")], []) == (
        calls.calls,
        archived(app),
        buffer_ids(app),
    )


# --- concurrency, leases, shutdown ---------------------------------------------------------------


def test_groups_of_one_worker_are_in_flight_on_the_loop_at_once(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """With concurrency 3, three groups' coroutines are in flight together: each waits at a
    barrier that opens only when all three have reached it."""
    barrier = asyncio.Barrier(3)
    calls = Calls()

    @app.handler(ActivityEvent, batch_size=2, retry=RetryPolicy(max_attempts=1))
    async def push(batch: Batch[ActivityEvent]) -> None:
        await asyncio.wait_for(barrier.wait(), WAIT_SECONDS)
        calls.record(batch)

    ids = commit_events(app.engine, 6)
    worker = Worker(app, concurrency=3, burst=True)
    worker.run()
    assert (ids, 3) == (calls.handled, worker.stats.groups_succeeded)


def test_async_handler_keeps_its_lease_while_it_runs(
    app: Outbox, commit_events: Callable[..., list[int]], running: Callable[[Worker], list[bool]]
) -> None:
    """While a coroutine runs for longer than a lease, its worker keeps extending the lease:
    nothing is rescued and the group is handled once."""
    app.with_settings(lease_seconds=1.0, rescue_interval=0.1)
    calls = Calls()
    started, release = threading.Event(), threading.Event()

    @app.handler(ActivityEvent, batch_size=10)
    async def push(batch: Batch[ActivityEvent]) -> None:
        started.set()
        await until(release)
        calls.record(batch)

    commit_events(app.engine, 3)
    results: list[BatchResult] = []
    returned = running(Worker(app, concurrency=1, distribute_every=0.1, on_result=results.append))
    wait_for(started.is_set, "the handler to start")
    (job,) = batch_jobs(app)
    began = time.monotonic()
    leases = {job.lease_expires_at}
    rescuer = Worker(app, concurrency=1)
    rescued = 0

    def extended_past_its_first_lease() -> bool:
        nonlocal rescued
        rescued += rescuer.rescue()
        leases.update(j.lease_expires_at for j in batch_jobs(app))
        return len(leases) >= 3 and time.monotonic() - began > 1.5

    wait_for(extended_past_its_first_lease, "the lease to be extended past its first term")
    release.set()
    wait_for(lambda: results, "the group to finish")
    assert ([1], ["succeeded"], 0, []) == (
        [attempt for attempt, _ in calls.calls],
        [r.outcome for r in results],
        rescued,
        returned,
    )


def test_stopping_worker_lets_an_in_flight_async_handler_finish(
    app: Outbox, commit_events: Callable[..., list[int]], running: Callable[[Worker], list[bool]]
) -> None:
    """stop() while a coroutine runs: the loop goes on running it, the group succeeds, and the
    worker ends cleanly."""
    calls = Calls()
    started, release = threading.Event(), threading.Event()

    @app.handler(ActivityEvent, batch_size=10)
    async def push(batch: Batch[ActivityEvent]) -> None:
        started.set()
        await until(release)
        calls.record(batch)

    ids = commit_events(app.engine, 3)
    worker = Worker(app, concurrency=1, distribute_every=0.1, shutdown_grace_period=WAIT_SECONDS)
    returned = running(worker)
    wait_for(started.is_set, "the handler to start")
    worker.stop()
    release.set()
    wait_for(lambda: returned, "the worker to end")
    assert ([True], ids, []) == (returned, calls.handled, buffer_ids(app))


def test_aborted_worker_cancels_its_in_flight_async_handler(
    app: Outbox, commit_events: Callable[..., list[int]], running: Callable[[Worker], list[bool]]
) -> None:
    """abort() while a coroutine runs: it is cancelled (sees CancelledError), no outcome is
    written, and its group stays leased for a rescue."""
    started, cancelled = threading.Event(), threading.Event()

    @app.handler(ActivityEvent, batch_size=10)
    async def push(batch: Batch[ActivityEvent]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    ids = commit_events(app.engine, 3)
    worker = Worker(app, concurrency=1, distribute_every=0.1)
    returned = running(worker)
    wait_for(started.is_set, "the handler to start")
    worker.abort()
    wait_for(lambda: returned, "the worker to end")
    (job,) = batch_jobs(app)
    assert ([False], True, ids, (1, None), 0) == (
        returned,
        cancelled.is_set(),
        buffer_ids(app),
        (job.attempts, job.last_error),
        _archived_count(app),
    )


def _archived_count(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(schema.archive)).scalar_one())
