"""Races forced deterministically on real PostgreSQL connections.

Each test holds one party inside its transaction at a precise step (a library ``queries`` function
wrapped to pause on an event, in one named thread only), runs the other party against it, and
then lets the first one go. Everything else is the library's real code path: workers lease and
complete jobs, rescue frees expired leases, claimers claim, distributors distribute.

Waits poll with a timeout; every pause is released in ``finally`` so no thread is left blocked.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import pytest
from sqlalchemy import Engine, create_engine, event, func, select, text, update
from structlog.testing import capture_logs

from outbox import Batch, Outbox, RetryPolicy, add_events, schema
from outbox._core import log as _log
from outbox._db import queries
from outbox._engine import claimer, distributor
from outbox._engine.claimer import Claim
from outbox.results import BatchResult
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.models import ActivityEvent

T = TypeVar("T")

WAIT_SECONDS = 10.0
"""How long any wait polls before the test fails instead of hanging."""

PROMPT_SECONDS = 5.0
"""A party that must not wait on the other finishes within this, while the other is held."""

TIMEOUTS = {"lock_timeout": "'2s'", "statement_timeout": "'5s'"}
"""Session settings that turn a lock wait or deadlock into an error instead of a hang."""

NO_DELAY = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)

jobs = schema.jobs
archive = schema.archive


# --- synchronisation helpers -----------------------------------------------------------------


class Background(Generic[T]):
    """Runs ``target`` in a named daemon thread and keeps its result or exception."""

    def __init__(self, name: str, target: Callable[[], T]) -> None:
        self.name = name
        self._target = target
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._target()
        except BaseException as error:
            self._error = error

    @property
    def done(self) -> bool:
        """True once the target returned or raised."""
        return not self._thread.is_alive()

    def wait(self, timeout: float = WAIT_SECONDS) -> T:
        """The target's result; re-raises what it raised; fails if it is still running."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"thread {self.name!r} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class Pause:
    """Holds the thread called ``thread_name`` at one point, the first time it gets there."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self.reached = threading.Event()
        self.resume = threading.Event()

    def here(self) -> None:
        """Called by the wrapped library function; blocks only the named thread, only once."""
        if threading.current_thread().name != self.thread_name or self.reached.is_set():
            return
        self.reached.set()
        if not self.resume.wait(WAIT_SECONDS):
            raise TimeoutError(f"{self.thread_name} was never resumed")

    def wait_reached(self) -> None:
        """Poll until the named thread is held here."""
        wait_for(self.reached.is_set, f"{self.thread_name} to reach its pause")


def pause_after(monkeypatch: pytest.MonkeyPatch, function_name: str, pause: Pause) -> list[Any]:
    """Wrap ``queries.<function_name>``: run it, record its result, then pause (named thread only).

    The caller's transaction stays open while the thread is held, with every lock the statement
    took. Returns the list of results the named thread got.
    """
    real = getattr(queries, function_name)
    results: list[Any] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if threading.current_thread().name == pause.thread_name:
            results.append(result)
        pause.here()
        return result

    monkeypatch.setattr(queries, function_name, wrapper)
    return results


def waiting_on_lock(observer: Engine, statement_part: str) -> bool:
    """True when some session of this database waits on a lock in a statement containing this."""
    with observer.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND strpos(query, :part) > 0"
            ),
            {"part": statement_part},
        ).scalar_one()
    return bool(waiting)


def record_database_errors(engine: Engine) -> list[BaseException]:
    """Every database error the engine meets, including the ones the library retries."""
    errors: list[BaseException] = []
    event.listen(engine, "handle_error", lambda context: errors.append(context.original_exception))
    return errors


def set_on_connect(engine: Engine, settings: dict[str, str]) -> None:
    """Give every new connection of ``engine`` these session settings (name: SQL value)."""

    @event.listens_for(engine, "connect", insert=True)
    def configure(dbapi_connection: Any, connection_record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            for name, value in settings.items():
                cursor.execute(f"SET SESSION {name} = {value}")
        dbapi_connection.autocommit = autocommit


# --- database helpers ------------------------------------------------------------------------


@pytest.fixture
def observer(postgres_database: str) -> Iterator[Engine]:
    """A separate engine for the test's own reads and writes, outside the library."""
    engine = create_engine(postgres_database)
    yield engine
    engine.dispose()


def expire_lease(observer: Engine, group_id: uuid.UUID) -> None:
    """Make the lease of a group's batch job run out now, as if its worker had stalled."""
    with observer.begin() as conn:
        expired = conn.execute(
            update(jobs)
            .where(jobs.c.group_id == group_id, jobs.c.lease_token.is_not(None))
            .values(lease_expires_at=text("statement_timestamp() - interval '1 second'"))
        ).rowcount
    assert 1 == expired, "the group's batch job was not leased"


def expired_leases(observer: Engine) -> int:
    """Jobs whose lease has run out, as committed now: what a rescue starting now would see."""
    with observer.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(jobs.c.lease_expires_at < func.statement_timestamp())
            ).scalar_one()
        )


def job_rows(observer: Engine) -> list[dict[str, Any]]:
    with observer.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(jobs).order_by(jobs.c.id))]


def archived(observer: Engine) -> list[tuple[int, str, int]]:
    """(event id, status, attempts) of every archived row, by event id."""
    with observer.connect() as conn:
        rows = conn.execute(
            select(archive.c.event_id, archive.c.status, archive.c.attempts).order_by(
                archive.c.event_id, archive.c.id
            )
        )
        return [(int(e), str(s), int(a)) for e, s, a in rows]


def buffer_groups(observer: Engine) -> dict[int, uuid.UUID | None]:
    """The group of every row still in the buffer, by event id."""
    with observer.connect() as conn:
        rows = conn.execute(select(ActivityEvent.id, ActivityEvent.group_id))
        return {int(i): g for i, g in rows}


def claim_group(app: Outbox) -> Claim:
    claim = claimer.run_once(app, app.get_handler("sync"))
    assert claim is not None, "nothing was claimed"
    return claim


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


# --- 1. rescue vs a worker finishing the same group ----------------------------------------


def test_rescue_racing_a_completion_past_its_fence_frees_nothing(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rescue while a completion is past its fence frees nothing (waits or skips); no re-run."""
    app = make_app(postgres_database)
    calls: list[int] = []

    @app.handler(ActivityEvent, name="sync", batch_size=10)
    def sync(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        expire_lease(observer, batch.group_id)  # the worker stalled past its lease

    commit_events(app.engine, 3)
    claim_group(app)
    fence = Pause("holder")
    # The completion's one statement deletes the job (its fence) and the rows; held open here.
    fenced = pause_after(monkeypatch, "finish_succeeded_group", fence)
    results: list[BatchResult] = []
    holder = Worker(app, concurrency=1, on_result=results.append)
    completion = Background("holder", holder.run_once)
    try:
        fence.wait_reached()
        expired_while_held = expired_leases(observer)
        rescue = Background("rescuer", Worker(app, concurrency=1).rescue)
        wait_for(
            lambda: rescue.done or waiting_on_lock(observer, "UPDATE outbox_jobs"),
            "the rescue to wait on the job or finish",
        )
    finally:
        fence.resume.set()
    completion.wait()
    rescued = rescue.wait()
    rerun = drain(app).jobs
    assert (1, [3], 0, ["succeeded"], [1], 0, [], {}) == (
        expired_while_held,
        fenced,
        rescued,
        [r.outcome for r in results],
        calls,
        rerun,
        job_rows(observer),
        buffer_groups(observer),
    )


def test_completion_after_a_committed_rescue_changes_nothing(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A completion queued behind a rescue deletes and archives nothing and logs lease lost."""
    app = make_app(postgres_database)
    handler_started = threading.Event()
    handler_may_return = threading.Event()

    @app.handler(ActivityEvent, name="sync", batch_size=10, archive=True)
    def sync(batch: Batch[ActivityEvent]) -> None:
        handler_started.set()
        if not handler_may_return.wait(WAIT_SECONDS):
            raise TimeoutError("the handler was never let go")

    ids = commit_events(app.engine, 3)
    group_id = claim_group(app).group_id
    rescue_pause = Pause("rescuer")
    pause_after(monkeypatch, "rescue_expired_jobs", rescue_pause)
    real_finish = queries.finish_succeeded_group
    fenced: list[bool] = []

    def finish_succeeded_group(*args: Any, **kwargs: Any) -> int | None:
        deleted = real_finish(*args, **kwargs)
        fenced.append(deleted is not None)
        return deleted

    monkeypatch.setattr(queries, "finish_succeeded_group", finish_succeeded_group)
    results: list[BatchResult] = []
    holder = Worker(app, concurrency=1, on_result=results.append)
    with capture_logs() as logs:
        completion = Background("holder", holder.run_once)
        try:
            wait_for(handler_started.is_set, "the handler to start")
            expire_lease(observer, group_id)
            rescue = Background("rescuer", Worker(app, concurrency=1).rescue)
            rescue_pause.wait_reached()  # rescued, not yet committed
            handler_may_return.set()
            wait_for(
                lambda: completion.done or waiting_on_lock(observer, "DELETE FROM outbox_jobs"),
                "the completion to wait on the rescue or finish",
            )
        finally:
            handler_may_return.set()
            rescue_pause.resume.set()
        rescued = rescue.wait()
        completion.wait()
    (job,) = job_rows(observer)
    assert (
        1,
        [False],
        ["lease_lost"],
        1,
        [],
        dict.fromkeys(ids, group_id),
        (None, 1, True),
    ) == (
        rescued,
        fenced,
        [r.outcome for r in results],
        sum(1 for entry in logs if entry["event"] == _log.LEASE_LOST),
        archived(observer),
        buffer_groups(observer),
        (job["lease_token"], job["attempts"], job["last_error"].startswith("lease expired")),
    )


# --- 2. zombies of a rescued group ---------------------------------------------------------


def test_zombie_success_and_zombie_failure_leave_only_the_new_holders_result(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
) -> None:
    """Two rescued holders record success then failure: both change nothing; one terminal state."""
    app = make_app(postgres_database)
    started = {attempt: threading.Event() for attempt in (1, 2, 3)}
    finish = {attempt: threading.Event() for attempt in (1, 2, 3)}

    @app.handler(ActivityEvent, name="sync", batch_size=10, retry=NO_DELAY, archive=True)
    def sync(batch: Batch[ActivityEvent]) -> None:
        started[batch.attempt].set()
        if not finish[batch.attempt].wait(WAIT_SECONDS):
            raise TimeoutError("the handler was never let go")
        if batch.attempt == 2:
            raise ValueError("downstream said no")

    ids = commit_events(app.engine, 3)
    group_id = claim_group(app).group_id
    results: dict[int, list[BatchResult]] = {1: [], 2: [], 3: []}
    holders: dict[int, Background[int]] = {}
    rescued: list[int] = []
    try:
        for attempt in (1, 2, 3):
            worker = Worker(app, concurrency=1, on_result=results[attempt].append)
            holders[attempt] = Background(f"holder-{attempt}", worker.run_once)
            wait_for(started[attempt].is_set, f"attempt {attempt} to start")
            if attempt < 3:
                expire_lease(observer, group_id)
                rescued.append(Worker(app, concurrency=1).rescue())
        # The zombies record while the new holder still holds the group.
        finish[1].set()
        holders[1].wait()
        finish[2].set()
        holders[2].wait()
        in_between = (job_rows(observer)[0]["attempts"], len(buffer_groups(observer)))
        finish[3].set()
        holders[3].wait()
    finally:
        for event_ in finish.values():
            event_.set()
    assert (
        [1, 1],
        {1: ["lease_lost"], 2: ["lease_lost"], 3: ["succeeded"]},
        (3, 3),
        [(i, "succeeded", 3) for i in ids],
        [],
        {},
    ) == (
        rescued,
        {attempt: [r.outcome for r in rs] for attempt, rs in results.items()},
        in_between,
        archived(observer),
        job_rows(observer),
        buffer_groups(observer),
    )


# --- 3. two claimers, overlapping claim transactions ---------------------------------------


def test_overlapping_claimers_take_disjoint_groups_without_waiting(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim while another claim's transaction is open finishes at once with the other rows."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="sync", batch_size=10)(noop)
    ids = commit_events(app.engine, 15)
    held = Pause("first")
    pause_after(monkeypatch, "claim_rows", held)
    first = Background("first", lambda: claim_group(app))
    try:
        held.wait_reached()
        second = Background("second", lambda: claim_group(app))
        second_claim = second.wait(PROMPT_SECONDS)
        first_still_open = not first.done
    finally:
        held.resume.set()
    first_claim = first.wait()
    groups = buffer_groups(observer)
    by_group = {
        g: sorted(i for i, gi in groups.items() if gi == g)
        for g in (first_claim.group_id, second_claim.group_id)
    }
    assert (True, ids[:10], ids[10:], 15) == (
        first_still_open,
        by_group[first_claim.group_id],
        by_group[second_claim.group_id],
        first_claim.size + second_claim.size,
    )


# --- 4. a claimer beside an open application transaction -----------------------------------


def test_claim_neither_waits_for_nor_sees_an_open_application_transaction(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Rows of an open application transaction are skipped without waiting, claimed after commit."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, name="sync", batch_size=100)(noop)
    application = create_engine(postgres_database)
    try:
        with application.connect() as conn:
            transaction = conn.begin()
            add_events(conn, ActivityEvent, [{"activity_id": n} for n in range(5)])
            uncommitted = list(conn.execute(select(ActivityEvent.id).order_by("id")).scalars())
            committed = commit_events(app.engine, 3)
            while_open = Background("claimer", lambda: claim_group(app)).wait(PROMPT_SECONDS)
            transaction.commit()
        after_commit = claim_group(app)
    finally:
        application.dispose()
    with app.engine.connect() as conn:
        groups = dict(conn.execute(select(ActivityEvent.id, ActivityEvent.group_id)).all())
    assert (committed, uncommitted) == (
        sorted(i for i, g in groups.items() if g == while_open.group_id),
        sorted(i for i, g in groups.items() if g == after_commit.group_id),
    )


# --- 5. dead-lettering completion vs rescue ------------------------------------------------


def test_rescue_racing_a_dead_letter_completion_leaves_it_archived_once(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rescue during a dead-letter completion frees nothing: archived once, never re-run."""
    app = make_app(postgres_database)
    calls: list[int] = []

    @app.handler(ActivityEvent, name="sync", batch_size=10, retry=RetryPolicy(max_attempts=1))
    def sync(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        expire_lease(observer, batch.group_id)
        raise ValueError("downstream said no")

    ids = commit_events(app.engine, 3)
    claim_group(app)
    archiving = Pause("holder")
    archived_counts = pause_after(monkeypatch, "archive_group_rows", archiving)
    results: list[BatchResult] = []
    completion = Background("holder", Worker(app, concurrency=1, on_result=results.append).run_once)
    try:
        archiving.wait_reached()
        expired_while_held = expired_leases(observer)
        rescue = Background("rescuer", Worker(app, concurrency=1).rescue)
        wait_for(
            lambda: rescue.done or waiting_on_lock(observer, "UPDATE outbox_jobs"),
            "the rescue to wait on the job or finish",
        )
    finally:
        archiving.resume.set()
    completion.wait()
    rescued = rescue.wait()
    rerun = drain(app).jobs
    assert (1, [3], 0, ["dead"], [1], 0, [(i, "dead", 1) for i in ids], [], {}) == (
        expired_while_held,
        archived_counts,
        rescued,
        [r.outcome for r in results],
        calls,
        rerun,
        archived(observer),
        job_rows(observer),
        buffer_groups(observer),
    )


def test_dead_letter_completion_after_a_committed_rescue_archives_nothing(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dead-letter completion queued behind a rescue archives nothing; the re-run archives."""
    app = make_app(postgres_database)
    calls: list[int] = []
    handler_started = threading.Event()
    handler_may_fail = threading.Event()

    @app.handler(ActivityEvent, name="sync", batch_size=10, retry=RetryPolicy(max_attempts=1))
    def sync(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        handler_started.set()
        if not handler_may_fail.wait(WAIT_SECONDS):
            raise TimeoutError("the handler was never let go")
        raise ValueError("downstream said no")

    ids = commit_events(app.engine, 3)
    group_id = claim_group(app).group_id
    rescue_pause = Pause("rescuer")
    pause_after(monkeypatch, "rescue_expired_jobs", rescue_pause)
    results: list[BatchResult] = []
    completion = Background("holder", Worker(app, concurrency=1, on_result=results.append).run_once)
    try:
        wait_for(handler_started.is_set, "the handler to start")
        expire_lease(observer, group_id)
        rescue = Background("rescuer", Worker(app, concurrency=1).rescue)
        rescue_pause.wait_reached()
        handler_may_fail.set()
        wait_for(
            lambda: completion.done or waiting_on_lock(observer, "DELETE FROM outbox_jobs"),
            "the completion to wait on the rescue or finish",
        )
    finally:
        handler_may_fail.set()
        rescue_pause.resume.set()
    rescued = rescue.wait()
    completion.wait()
    after_race = archived(observer)
    rerun: list[BatchResult] = []
    Worker(app, concurrency=1, on_result=rerun.append).run_once()
    assert (1, ["lease_lost"], [], ["dead"], [1], [(i, "dead", 2) for i in ids], [], {}) == (
        rescued,
        [r.outcome for r in results],
        after_race,
        [r.outcome for r in rerun],
        calls,
        archived(observer),
        job_rows(observer),
        buffer_groups(observer),
    )


# --- 6. completion vs distributor, lock orders reversed ------------------------------------


def test_completion_and_distributor_in_reversed_lock_order_both_finish(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A completion (job, then buffer rows) and a distributor (buffer, then jobs) never deadlock."""
    app = make_app(postgres_database)
    set_on_connect(app.engine, TIMEOUTS)
    app.handler(ActivityEvent, name="sync", batch_size=10, archive=True)(noop)
    errors = record_database_errors(app.engine)
    group = commit_events(app.engine, 10)
    claim_group(app)
    commit_events(app.engine, 25)
    completion_pause = Pause("completion")
    pause_after(monkeypatch, "finish_succeeded_group", completion_pause)
    distribution_pause = Pause("distributor")
    pause_after(monkeypatch, "count_unclaimed", distribution_pause)
    results: list[BatchResult] = []
    worker = Worker(app, concurrency=1, on_result=results.append)
    handler = app.get_handler("sync")
    completion = Background("completion", worker.run_once)
    try:
        completion_pause.wait_reached()  # holds the batch job's row lock
        distribution = Background(
            "distributor", lambda: distributor.distribute_handler(app, handler)
        )
        distribution_pause.wait_reached()  # has read the buffer, inserts jobs next
    finally:
        completion_pause.resume.set()
        distribution_pause.resume.set()
    completion.wait()
    distributed = distribution.wait()
    with observer.connect() as conn:
        claim_jobs = conn.execute(
            select(func.count()).where(jobs.c.kind == schema.JobKind.CLAIM)
        ).scalar_one()
    assert ([], ["succeeded"], 3, 3, [(i, "succeeded", 1) for i in group]) == (
        errors,
        [r.outcome for r in results],
        distributed.enqueued,
        claim_jobs,
        archived(observer),
    )


# --- 7. overlapping distributors -----------------------------------------------------------


def test_overlapping_distributors_enqueue_only_the_claim_jobs_needed(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    observer: Engine,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two distributions that both counted before either inserted enqueue ceil(rows/size) in all."""
    app = make_app(postgres_database)
    set_on_connect(app.engine, TIMEOUTS)
    app.handler(ActivityEvent, name="sync", batch_size=10)(noop)
    errors = record_database_errors(app.engine)
    commit_events(app.engine, 25)
    counted = threading.Barrier(2, timeout=WAIT_SECONDS)
    real_insert = queries.insert_claim_jobs

    def insert_after_both_counted(*args: Any, **kwargs: Any) -> int:
        if threading.current_thread().name.startswith("distributor"):
            counted.wait()
        return real_insert(*args, **kwargs)

    monkeypatch.setattr(queries, "insert_claim_jobs", insert_after_both_counted)
    handler = app.get_handler("sync")
    try:
        runs = [
            Background(f"distributor-{n}", lambda: distributor.distribute_handler(app, handler))
            for n in range(2)
        ]
        distributions = [run.wait() for run in runs]
    finally:
        counted.abort()
    with observer.connect() as conn:
        slots = sorted(
            conn.execute(select(jobs.c.slot).where(jobs.c.kind == schema.JobKind.CLAIM)).scalars()
        )
    assert ([], [0, 0], 3, [0, 1, 2]) == (
        errors,
        [d.pending for d in distributions],
        sum(d.enqueued for d in distributions),
        slots,
    )
