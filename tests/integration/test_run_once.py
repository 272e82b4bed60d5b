"""The run-once API: rescue, distribute and run what is due once, from any scheduler, on real
databases; what each call did and what it left, as values and as JSON."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import select, update

from outbox import (
    Batch,
    Outbox,
    RetryPolicy,
    Settings,
    distribute_once,
    jsonable,
    rescue_once,
    run_once,
    schema,
    work_once,
)
from outbox._db import queries
from outbox.once import Stopped
from outbox.ops import fleet
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent

HOUR = 3600.0
"""A schedule's interval long enough that calls in one test share a tick."""


class Recorder:
    """A handler that records the ids it was given, and how many batches."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self.lock:
            self.ids += [event.id for event in batch]


@pytest.fixture
def recorder() -> Recorder:
    """The handler's record of what it handled."""
    return Recorder()


@pytest.fixture
def app(make_app: Callable[..., Outbox], database_url: str, recorder: Recorder) -> Outbox:
    """An application with one handler of batch size 10, on each database."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="record", batch_size=10)(recorder)
    return app


@pytest.fixture
def sqlite_database(sqlite_url: str) -> str:
    """A migrated SQLite file: for what the run-once API decides itself, the same on every
    database (what each database does is the tests above, and tests/conformance's)."""
    reset_schema(sqlite_url)
    return sqlite_url


@pytest.fixture
def sqlite_app(make_app: Callable[..., Outbox], sqlite_database: str, recorder: Recorder) -> Outbox:
    """An application with one handler of batch size 10, on SQLite."""
    app = make_app(sqlite_database)
    app.handler(ActivityEvent, name="record", batch_size=10)(recorder)
    return app


def test_run_once_handles_every_waiting_event_and_says_nothing_is_left(
    sqlite_app: Outbox, recorder: Recorder, commit_events: Callable[..., list[int]]
) -> None:
    """25 events, batches of 10: three groups succeed; the buffer is empty, nothing is due."""
    ids = commit_events(sqlite_app.engine, 25)
    result = run_once(sqlite_app)
    work = result.work
    assert (ids, Stopped.IDLE, 3, 25, 0, None, None) == (
        sorted(recorder.ids),
        work.stopped,
        work.groups_succeeded,
        work.events_succeeded,
        work.backlog,
        work.oldest_age,
        work.next_due_in,
    )


def test_a_failed_group_is_counted_and_its_retry_is_when_work_is_next_due(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """The handler fails: one group failed, its events left, due again after its backoff."""
    app = make_app(sqlite_database)

    @app.handler(
        ActivityEvent, retry=RetryPolicy(max_attempts=3, scale=0.0, base_delay=60.0, jitter=0.0)
    )
    def failing(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("downstream is down")

    commit_events(app.engine, 4)
    work = run_once(app).work
    due = work.next_due_in or 0.0
    assert (1, 0, 4, False, True) == (
        work.groups_failed,
        work.groups_succeeded,
        work.backlog,
        work.needs_operator,
        30.0 < due <= 60.0,
    )


def test_a_dead_lettered_group_needs_an_operator(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """A group out of attempts is dead: counted, and the result says someone should look."""
    app = make_app(sqlite_database)

    @app.handler(ActivityEvent, retry=RetryPolicy(max_attempts=1))
    def failing(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("poison")

    commit_events(app.engine, 2)
    result = run_once(app)
    assert (1, True, 0) == (result.work.groups_dead, result.needs_operator, result.work.backlog)


def test_the_budget_stops_new_jobs_and_what_is_left_is_due_now(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """Slow batches and a short budget: it stops for the budget, events left, due now."""
    app = make_app(sqlite_database)

    @app.handler(ActivityEvent, batch_size=1)
    def slow(batch: Batch[ActivityEvent]) -> None:
        time.sleep(0.2)

    commit_events(app.engine, 20)
    work = run_once(app, budget_seconds=0.1).work
    assert (Stopped.BUDGET, True, 0.0) == (work.stopped, 0 < work.backlog < 20, work.next_due_in)


def test_the_result_asks_for_workers_while_runnable_events_are_left(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """A run stopped by its group bound with events runnable asks for at least one worker
    slot; the run that drains them asks for none."""
    app = make_app(sqlite_database)
    app.handler(ActivityEvent, name="record", batch_size=1)(Recorder())
    commit_events(app.engine, 5)
    stopped = run_once(app, max_groups=1)
    drained = run_once(app)
    assert (True, 0, 0) == (
        stopped.desired_workers >= 1,
        drained.desired_workers,
        drained.work.backlog,
    )


def test_max_groups_bounds_the_groups_run_even_inside_one_claim_job(
    sqlite_app: Outbox, recorder: Recorder, commit_events: Callable[..., list[int]]
) -> None:
    """Five full batches waiting, one claim job's worth: two groups are run, and the rest is
    left, due now, for the next caller."""
    commit_events(sqlite_app.engine, 50)
    work = run_once(sqlite_app, max_groups=2).work
    assert (Stopped.MAX_GROUPS, 2, 20, 30, 0.0) == (
        work.stopped,
        work.groups,
        len(recorder.ids),
        work.backlog,
        work.next_due_in,
    )


def test_a_stop_set_while_a_group_runs_lets_it_finish_and_starts_no_other(
    make_app: Callable[..., Outbox],
    sqlite_database: str,
    recorder: Recorder,
    commit_events: Callable[..., list[int]],
) -> None:
    """The application shuts down during the first group: it is handled, no other starts."""
    stop = threading.Event()
    app = make_app(sqlite_database)
    app.handler(ActivityEvent, name="record", batch_size=10)(_stopping_after_one(recorder, stop))
    commit_events(app.engine, 30)
    work = run_once(app, stop=stop).work
    assert (Stopped.STOPPED, 1, 10, 20) == (
        work.stopped,
        work.groups_succeeded,
        len(recorder.ids),
        work.backlog,
    )


def test_an_operators_stop_lets_the_group_in_flight_finish_and_starts_no_other(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """``outbox workers stop`` of a run-once caller, as of any worker: read at its next
    heartbeat, the group in flight finishes and no other starts."""
    app = make_app(sqlite_database, Settings(lease_seconds=1.5))  # a heartbeat every 0.5 s

    asked: list[str] = []

    @app.handler(ActivityEvent, batch_size=10)
    def slow(batch: Batch[ActivityEvent]) -> None:
        if not asked:
            (caller,) = fleet.workers(app)
            asked.append(fleet.ask(app, caller.id, "stop", actor="ops").worker.id)
        time.sleep(1.6)  # the work itself: three heartbeats long

    commit_events(app.engine, 30)
    work = run_once(app).work
    assert (Stopped.STOPPED, 1, 20) == (work.stopped, work.groups_succeeded, work.backlog)


def _stopping_after_one(recorder: Recorder, stop: threading.Event) -> Callable[..., None]:
    def handle(batch: Batch[Any]) -> None:
        recorder(batch)
        stop.set()

    return handle


def test_distribution_on_a_tick_is_done_once_and_the_second_caller_learns_it_lost(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Two calls on the same tick: the first enqueues claim jobs, the second does nothing and
    says so."""
    commit_events(app.engine, 25)
    first = distribute_once(app, every=HOUR)
    second = distribute_once(app, every=HOUR)
    assert (["record"], [], 3, [], ["record"], 0, first.tick) == (
        first.won,
        first.lost,
        first.enqueued,
        second.won,
        second.lost,
        second.enqueued,
        second.tick,
    )


def test_without_a_schedule_every_call_distributes(
    sqlite_app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """No ``every``: no tick; each call distributes (the second finds the claim jobs there)."""
    commit_events(sqlite_app.engine, 25)
    first = distribute_once(sqlite_app)
    second = distribute_once(sqlite_app)
    assert ((None, ["record"], 3), (None, ["record"], 0)) == (
        (first.tick, first.won, first.enqueued),
        (second.tick, second.won, second.enqueued),
    )


def test_the_tick_is_read_from_the_databases_clock(app: Outbox) -> None:
    """The tick is the start of the database's current hour, in milliseconds."""
    result = distribute_once(app, every=HOUR)
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
    if now.tzinfo is None:  # SQLite and MariaDB: UTC without a zone
        now = now.replace(tzinfo=dt.UTC)
    assert int(now.replace(minute=0, second=0, microsecond=0).timestamp()) * 1000 == result.tick


def test_a_tick_named_by_the_callers_schedule_is_taken_when_near_the_databases(
    app: Outbox,
) -> None:
    """``at`` in the hour before the database's: that hour's tick is taken."""
    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=HOUR)
    result = distribute_once(app, every=HOUR, at=at)
    assert (int(at.replace(minute=0, second=0, microsecond=0).timestamp()) * 1000, ["record"]) == (
        result.tick,
        result.won,
    )


def test_a_tick_named_far_from_the_databases_is_not_trusted(app: Outbox) -> None:
    """``at`` a day ahead of the database's clock: the database's tick is taken instead."""
    result = distribute_once(app, every=HOUR, at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
    if now.tzinfo is None:  # SQLite and MariaDB: UTC without a zone
        now = now.replace(tzinfo=dt.UTC)
    assert int(now.replace(minute=0, second=0, microsecond=0).timestamp()) * 1000 == result.tick


def test_rescue_once_frees_a_lease_that_ran_out(
    sqlite_app: Outbox, recorder: Recorder, commit_events: Callable[..., list[int]]
) -> None:
    """A run killed mid-way left a group leased; once the lease ended, the next run's rescue
    frees it and its work handles it."""
    ids = commit_events(sqlite_app.engine, 3)
    distribute_once(sqlite_app)
    with sqlite_app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs).values(
                lease_owner=f"{queries.RUN_ONCE_PREFIX}gone:1:ab",
                lease_token=uuid.uuid4(),
                lease_expires_at=queries.database_now(conn).replace(year=2000),
            )
        )
    assert (1, 0) == (rescue_once(sqlite_app).rescued, rescue_once(sqlite_app).rescued)
    run_once(sqlite_app)
    assert ids == sorted(recorder.ids)


def test_a_caller_is_listed_with_the_workers_while_it_works_and_leaves_no_row(
    make_app: Callable[..., Outbox], database_url: str, commit_events: Callable[..., list[int]]
) -> None:
    """From inside its handler, ``outbox status``'s worker list shows the caller (its id begins
    with ``once:``, and it does not lead); after the call, no row is left."""
    app = make_app(database_url)
    seen: list[tuple[bool, bool]] = []

    @app.handler(ActivityEvent)
    def look(batch: Batch[ActivityEvent]) -> None:
        seen.extend((w.id.startswith("once:"), w.leader) for w in fleet.workers(app))

    commit_events(app.engine, 1)
    run_once(app)
    assert ([(True, False)], []) == (seen, fleet.workers(app))


def test_handler_objects_are_started_before_and_stopped_after(
    make_app: Callable[..., Outbox], sqlite_database: str, commit_events: Callable[..., list[int]]
) -> None:
    """A sink-like object is started before its first batch and stopped after the last."""
    app = make_app(sqlite_database)
    calls: list[str] = []

    class Sink:
        def outbox_start(self, app: Outbox, handler: Any) -> None:
            calls.append("start")

        def outbox_stop(self) -> None:
            calls.append("stop")

        def __call__(self, batch: Batch[Any]) -> None:
            calls.append("batch")

    app.handler(ActivityEvent, name="sink")(Sink())
    commit_events(app.engine, 1)
    work_once(app)  # nothing distributed yet: no batch, but started and stopped all the same
    run_once(app)
    assert ["start", "stop", "start", "batch", "stop"] == calls


def test_the_result_prints_as_json(
    sqlite_app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Through outbox's one JSON conversion: the parts, their counts and their properties."""
    commit_events(sqlite_app.engine, 5)
    data = json.loads(json.dumps(jsonable(run_once(sqlite_app, every=HOUR))))
    assert (["record"], 1, "idle", 1, False, 0, 0) == (
        data["distribution"]["won"],
        data["distribution"]["enqueued"],
        data["work"]["stopped"],
        data["work"]["groups_succeeded"],
        data["needs_operator"],
        data["desired_workers"],
        data["scaling"]["desired_workers"],
    )


@pytest.fixture
def two_handlers(
    make_app: Callable[..., Outbox], server_database: str
) -> tuple[Outbox, list[Outbox], Recorder]:
    """Three applications on one database server (three schedulers' processes), each with
    two handlers that record into one recorder."""
    recorder = Recorder()
    apps = []
    for _ in range(3):
        app = make_app(server_database)
        app.handler(ActivityEvent, name="activity", batch_size=10)(recorder)
        app.handler(EmailEvent, name="email", batch_size=10)(recorder)
        apps.append(app)
    return apps[0], apps, recorder


def test_three_schedulers_on_one_tick_distribute_once_and_handle_each_event_once(
    two_handlers: tuple[Outbox, list[Outbox], Recorder],
    commit_events: Callable[..., list[int]],
) -> None:
    """Three callers at once on the same tick: each handler's tick is won by exactly one of
    them, the two others learn they lost, and every event is handled exactly once."""
    app, apps, recorder = two_handlers
    ids = commit_events(app.engine, 30) + commit_events(app.engine, 30, EmailEvent)
    barrier = threading.Barrier(len(apps))

    def call(caller: Outbox) -> Any:
        barrier.wait()
        return run_once(caller, every=HOUR)

    with ThreadPoolExecutor(len(apps)) as pool:
        results = list(pool.map(call, apps))
    winners = {
        name: sum(name in r.distribution.won for r in results) for name in ("activity", "email")
    }
    losers = {
        name: sum(name in r.distribution.lost for r in results) for name in ("activity", "email")
    }
    with app.engine.connect() as conn:
        left = conn.execute(select(schema.jobs.c.id)).all()
    assert ({"activity": 1, "email": 1}, {"activity": 2, "email": 2}, sorted(ids), []) == (
        winners,
        losers,
        sorted(recorder.ids),
        left,
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda app: work_once(app, budget_seconds=0), "budget_seconds must be > 0"),
        (lambda app: work_once(app, budget_seconds=float("nan")), "budget_seconds must be > 0"),
        (lambda app: work_once(app, max_groups=0), "max_groups must be a whole number >= 1"),
        (lambda app: distribute_once(app, every=0), "every must be 0.001 to"),
        (lambda app: distribute_once(app, every=float("inf")), "every must be 0.001 to"),
        (
            lambda app: distribute_once(app, every=60.0, at=dt.datetime(2026, 1, 1)),
            "at must be a datetime with a time zone",
        ),
    ],
)
def test_bad_bounds_are_refused_naming_them(
    make_app: Callable[..., Outbox], call: Callable[[Outbox], Any], message: str
) -> None:
    """Refused where they are passed, before touching the database."""
    app = make_app("sqlite://")
    with pytest.raises(ValueError, match=message):
        call(app)
