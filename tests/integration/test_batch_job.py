"""Batch jobs: success, archive, retry with backoff, dead letters, partial failure, fencing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select, update

from outbox import Batch, Outbox, RetryPolicy, schema
from outbox._db.queries import database_now
from outbox._engine import claimer
from outbox._engine.claimer import Claim
from outbox.results import BatchResult
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent, EmailEvent

# Retries due at once, so that a drain runs every attempt.
IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)


class Recorder:
    """A handler that records each call and behaves as the test tells it to."""

    def __init__(self, behave: Callable[[Batch[Any]], None] | None = None) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self.behave = behave

    def __call__(self, batch: Batch[Any]) -> None:
        self.calls.append((batch.attempt, [e.id for e in batch.events]))
        if self.behave is not None:
            self.behave(batch)


def fail(batch: Batch[Any]) -> None:
    """A handler whose downstream refuses every group."""
    raise ValueError("downstream said no")


def register(app: Outbox, func: Callable[[Batch[Any]], None], **options: Any) -> None:
    """Register ``func`` as the handler "sync" of ActivityEvent, batch_size 10."""
    app.handler(ActivityEvent, name="sync", batch_size=10, **options)(func)


def handle_one_group(
    app: Outbox, commit_events: Callable[..., list[int]], count: int = 3
) -> BatchResult:
    """Commit events, claim them as one group, and run that group's batch job once."""
    commit_events(app.engine, count)
    claim_group(app)
    return run_due_batch_job(app)


def claim_group(app: Outbox) -> Claim:
    """Claim one group for the handler "sync"; there must be events to claim."""
    claim = claimer.run_once(app, app.get_handler("sync"))
    assert claim is not None, "nothing was claimed"
    return claim


def run_due_batch_job(app: Outbox) -> BatchResult:
    """Lease and run the next due job, which must be a batch job."""
    results: list[BatchResult] = []
    Worker(app, concurrency=1, on_result=results.append).run_once()
    (result,) = results
    return result


def buffer_ids(app: Outbox) -> list[int]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(ActivityEvent.id).order_by(ActivityEvent.id)).scalars())


def jobs(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.jobs).order_by(schema.jobs.c.id)))


def archived(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.archive).order_by(schema.archive.c.event_id)))


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    return make_app(database_url)


# --- success ------------------------------------------------------------------------------


def test_handler_receives_the_group_in_id_order_on_attempt_one(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The handler gets every event of the group, ordered by id, as attempt 1."""
    recorder = Recorder()
    register(app, recorder)
    ids = commit_events(app.engine, 4)
    claim_group(app)
    run_due_batch_job(app)
    assert [(1, ids)] == recorder.calls


def test_handler_receives_detached_model_instances(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Events are loaded model instances whose columns can be read without a session."""
    seen: list[tuple[int, str]] = []
    register(app, lambda batch: seen.extend((e.activity_id, e.kind) for e in batch.events))
    handle_one_group(app, commit_events, count=2)
    assert [(0, "viewed"), (1, "viewed")] == seen


def test_success_deletes_the_rows_and_the_job(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A handler that returns leaves no rows, no job and no archive behind."""
    register(app, Recorder())
    result = handle_one_group(app, commit_events)
    assert (("succeeded", 3, 3), [], [], []) == (
        (result.outcome, result.size, result.succeeded),
        buffer_ids(app),
        jobs(app),
        archived(app),
    )


def test_success_leaves_other_groups_alone(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Completing one group deletes only its own rows."""
    register(app, Recorder())
    ids = commit_events(app.engine, 15)
    claim_group(app)
    claim_group(app)
    run_due_batch_job(app)
    assert ids[10:] == buffer_ids(app)


def test_archive_copies_succeeded_rows(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """With archive=True, each row of a succeeded group is archived as succeeded."""
    register(app, Recorder(), archive=True)
    ids = commit_events(app.engine, 3)
    claim = claim_group(app)
    run_due_batch_job(app)
    expected = [
        ("sync", "test_activity_events", i, claim.group_id, "succeeded", 1, None) for i in ids
    ]
    actual = [
        (r.handler, r.buffer, r.event_id, r.group_id, r.status, r.attempts, r.error)
        for r in archived(app)
    ]
    assert (expected, []) == (actual, buffer_ids(app))


def test_archive_payload_holds_the_columns_by_name(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The archived payload is the row as a JSON object keyed by column name."""
    register(app, Recorder(), archive=True)
    (event_id,) = commit_events(app.engine, 1, activity_id=42, kind="clicked")
    claim_group(app)
    run_due_batch_job(app)
    (row,) = archived(app)
    assert ({"id", "group_id", "created_at", "activity_id", "kind"}, event_id, 42, "clicked") == (
        set(row.payload),
        row.payload["id"],
        row.payload["activity_id"],
        row.payload["kind"],
    )


def test_archive_payload_keeps_a_json_column_as_json(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A JSON column is archived as a JSON value, not as a string holding JSON."""
    app.handler(EmailEvent, name="sync", archive=True)(Recorder())
    commit_events(app.engine, 1, EmailEvent, data={"tags": ["a", "b"], "n": 1})
    claim_group(app)
    run_due_batch_job(app)
    (row,) = archived(app)
    assert {"tags": ["a", "b"], "n": 1} == row.payload["data"]


def test_archive_keeps_the_event_creation_time(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The archive row carries the event's created_at."""
    register(app, Recorder(), archive=True)
    commit_events(app.engine, 1)
    with app.engine.connect() as conn:
        created_at = conn.execute(select(ActivityEvent.created_at)).scalar_one()
    claim_group(app)
    run_due_batch_job(app)
    assert [created_at] == [r.created_at for r in archived(app)]


# --- failure --------------------------------------------------------------------------------


def test_raising_handler_keeps_the_rows_in_their_group(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A failed attempt keeps every row, still claimed by the same group."""
    register(app, fail)
    ids = commit_events(app.engine, 3)
    claim = claim_group(app)
    result = run_due_batch_job(app)
    with app.engine.connect() as conn:
        groups = set(conn.execute(select(ActivityEvent.group_id)).scalars())
    assert ("retrying", ids, {claim.group_id}) == (
        result.outcome,
        buffer_ids(app),
        groups,
    )


def test_raising_handler_reschedules_with_the_policy_delay(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """After failed attempt 1 the job is due again in about RetryPolicy.delay(1) seconds."""
    register(app, fail, retry=RetryPolicy(jitter=0.0))
    handle_one_group(app, commit_events)
    with app.engine.connect() as conn:
        now = database_now(conn)
    (job,) = jobs(app)
    wait = (job.run_at - now).total_seconds()
    assert (1, None, True) == (job.attempts, job.lease_token, 4.5 < wait <= 6.0)


def test_raising_handler_records_type_and_message(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The job's last_error starts with the exception's type and message."""
    register(app, fail)
    handle_one_group(app, commit_events)
    (job,) = jobs(app)
    assert "ValueError: downstream said no" == job.last_error.splitlines()[0]


class UnprintableError(Exception):
    """An exception whose message cannot be built."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


def test_exception_that_cannot_be_printed_still_fails_its_attempt(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """An exception whose __str__ raises fails the attempt like any other, recorded by its type,
    and the group is retried."""

    def fail_once(batch: Batch[Any]) -> None:
        if batch.attempt == 1:
            raise UnprintableError

    recorder = Recorder(fail_once)
    register(app, recorder, retry=IMMEDIATE)
    ids = commit_events(app.engine, 2)
    results: list[BatchResult] = []
    Worker(app, concurrency=1, burst=True, on_result=results.append).run()
    assert ([(1, ids), (2, ids)], ["retrying", "succeeded"], [], True) == (
        recorder.calls,
        [r.outcome for r in results],
        buffer_ids(app),
        (results[0].error or "").startswith("UnprintableError: <exception str() failed>"),
    )


def test_handler_that_exits_fails_its_attempt_and_the_worker_goes_on(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """SystemExit from a handler (or a library it calls) fails the attempt with its code; the
    worker keeps running and the retry delivers the group."""

    def exit_once(batch: Batch[Any]) -> None:
        if batch.attempt == 1:
            raise SystemExit(3)

    recorder = Recorder(exit_once)
    register(app, recorder, retry=IMMEDIATE)
    ids = commit_events(app.engine, 2)
    results: list[BatchResult] = []
    Worker(app, concurrency=2, burst=True, on_result=results.append).run()
    assert ([(1, ids), (2, ids)], ["retrying", "succeeded"], [], "SystemExit: 3") == (
        recorder.calls,
        [r.outcome for r in results],
        buffer_ids(app),
        (results[0].error or "").splitlines()[0],
    )


def test_rescheduled_group_is_not_due_before_its_delay(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """A group waiting for its retry is not handled by a drain now."""
    recorder = Recorder(fail)
    register(app, recorder)
    handle_one_group(app, commit_events)
    drain(app)
    assert 1 == len(recorder.calls)


def test_retried_group_gets_the_next_attempt_number(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Each retry of a group is handed over with the next attempt number."""
    recorder = Recorder(fail)
    register(app, recorder, retry=IMMEDIATE)
    ids = commit_events(app.engine, 2)
    drain(app)
    assert [(1, ids), (2, ids), (3, ids)] == recorder.calls


def test_exhausted_group_is_archived_as_dead(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """After max_attempts failures every row is archived as dead with the attempt count."""
    register(app, fail, retry=IMMEDIATE)
    ids = commit_events(app.engine, 3)
    drain(app)
    rows = archived(app)
    assert ([(i, "dead", 3) for i in ids], [], []) == (
        [(r.event_id, r.status, r.attempts) for r in rows],
        buffer_ids(app),
        jobs(app),
    )


def test_dead_rows_keep_the_last_error(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Dead-lettered rows carry the error of the last attempt."""
    register(app, fail, retry=IMMEDIATE)
    commit_events(app.engine, 2)
    drain(app)
    assert {"ValueError: downstream said no"} == {r.error.splitlines()[0] for r in archived(app)}


def test_dead_letter_happens_even_without_archive(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """archive=False only concerns succeeded groups: dead rows are always kept."""
    register(app, fail, retry=RetryPolicy(max_attempts=1), archive=False)
    result = handle_one_group(app, commit_events, count=2)
    assert ("dead", 2, 2) == (result.outcome, result.dead, len(archived(app)))


# --- partial failure ------------------------------------------------------------------------


def retry_even_ids(batch: Batch[Any]) -> None:
    """On the first attempt, hand the events with even ids back for a later retry."""
    if batch.attempt == 1:
        batch.retry([e for e in batch.events if e.id % 2 == 0], "rate limited")


def test_retried_events_move_to_a_new_group(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Events passed to batch.retry stay in the buffer under a new group; the rest are done."""
    register(app, retry_even_ids)
    ids = commit_events(app.engine, 4)
    claim = claim_group(app)
    run_due_batch_job(app)
    with app.engine.connect() as conn:
        rows = list(conn.execute(select(ActivityEvent.id, ActivityEvent.group_id)))
    assert ([i for i in ids if i % 2 == 0], 1, False) == (
        [r.id for r in rows],
        len({r.group_id for r in rows}),
        claim.group_id in {r.group_id for r in rows},
    )


def test_retried_events_get_a_job_that_continues_the_attempt_count(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The new group's job carries the attempts so far, the reason, and the backoff."""
    register(app, retry_even_ids, retry=RetryPolicy(jitter=0.0))
    handle_one_group(app, commit_events, count=4)
    (job,) = jobs(app)
    with app.engine.connect() as conn:
        wait = (job.run_at - database_now(conn)).total_seconds()
        group_id = conn.execute(select(ActivityEvent.group_id).limit(1)).scalar_one()
    assert ("batch", group_id, 1, "rate limited", True) == (
        job.kind,
        job.group_id,
        job.attempts,
        job.last_error,
        4.5 < wait <= 6.0,
    )


def test_retried_events_are_handed_over_as_the_next_attempt(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The split-off group runs as attempt 2 with only the retried events."""
    recorder = Recorder(retry_even_ids)
    register(app, recorder, retry=IMMEDIATE)
    ids = commit_events(app.engine, 4)
    drain(app)
    assert [(1, ids), (2, [i for i in ids if i % 2 == 0])] == recorder.calls


def test_retried_events_on_the_last_attempt_are_dead(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """batch.retry on the last allowed attempt dead-letters those events with the reason."""
    register(
        app,
        lambda batch: batch.retry(batch.events[:1], "still rate limited"),
        retry=RetryPolicy(max_attempts=1),
    )
    ids = commit_events(app.engine, 3)
    claim_group(app)
    result = run_due_batch_job(app)
    assert (1, 0, [(ids[0], "dead", "still rate limited")], []) == (
        result.dead,
        result.retried,
        [(r.event_id, r.status, r.error) for r in archived(app)],
        buffer_ids(app),
    )


def test_discarded_events_are_archived_as_discarded(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """batch.discard archives those events as discarded with the reason; the rest succeed."""
    register(app, lambda batch: batch.discard(batch.events[1:], "invalid address"))
    ids = commit_events(app.engine, 3)
    claim_group(app)
    result = run_due_batch_job(app)
    expected = [(i, "discarded", "invalid address", 1) for i in ids[1:]]
    assert ((1, 2), expected, [], []) == (
        (result.succeeded, result.discarded),
        [(r.event_id, r.status, r.error, r.attempts) for r in archived(app)],
        buffer_ids(app),
        jobs(app),
    )


def test_discard_with_archive_archives_each_event_once(
    app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """With archive=True, discarded events are archived as discarded only, the rest succeeded."""
    register(app, lambda batch: batch.discard(batch.events[:1], "invalid"), archive=True)
    ids = commit_events(app.engine, 3)
    claim_group(app)
    run_due_batch_job(app)
    expected = [(ids[0], "discarded"), (ids[1], "succeeded"), (ids[2], "succeeded")]
    assert expected == [(r.event_id, r.status) for r in archived(app)]


# --- lease fencing ----------------------------------------------------------------------------


@pytest.fixture
def other_connection(database_url: str) -> Iterator[Engine]:
    """Another engine: a rescuing worker elsewhere."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def steal_lease(engine: Engine) -> uuid.UUID:
    """Give every leased job a new token, as a rescue and a re-lease by another worker would."""
    token = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.lease_token.is_not(None))
            .values(lease_token=token, lease_owner="another-worker")
        )
    return token


def test_completion_after_lost_lease_changes_nothing(
    app: Outbox, other_connection: Engine, commit_events: Callable[..., list[int]]
) -> None:
    """If the lease is taken over during the handler, the rows and the job stay as they are."""
    tokens: list[uuid.UUID] = []
    register(app, lambda batch: tokens.append(steal_lease(other_connection)), archive=True)
    ids = commit_events(app.engine, 3)
    claim_group(app)
    result = run_due_batch_job(app)
    (job,) = jobs(app)
    assert ("lease_lost", ids, tokens, "another-worker", []) == (
        result.outcome,
        buffer_ids(app),
        [job.lease_token],
        job.lease_owner,
        archived(app),
    )


def test_failure_after_lost_lease_does_not_reschedule(
    app: Outbox, other_connection: Engine, commit_events: Callable[..., list[int]]
) -> None:
    """A failed attempt whose lease was taken over neither moves run_at nor records its error."""

    def steal_then_fail(batch: Batch[Any]) -> None:
        steal_lease(other_connection)
        raise ValueError("too late")

    register(app, steal_then_fail)
    commit_events(app.engine, 2)
    claim_group(app)
    (before,) = jobs(app)
    result = run_due_batch_job(app)
    (after,) = jobs(app)
    assert ("lease_lost", before.run_at, None, 1) == (
        result.outcome,
        after.run_at,
        after.last_error,
        after.attempts,
    )


def test_dead_letter_after_lost_lease_archives_nothing(
    app: Outbox, other_connection: Engine, commit_events: Callable[..., list[int]]
) -> None:
    """A last attempt whose lease was taken over does not dead-letter the group."""

    def steal_then_fail(batch: Batch[Any]) -> None:
        steal_lease(other_connection)
        raise ValueError("too late")

    register(app, steal_then_fail, retry=RetryPolicy(max_attempts=1))
    ids = commit_events(app.engine, 2)
    claim_group(app)
    result = run_due_batch_job(app)
    assert ("lease_lost", ids, []) == (result.outcome, buffer_ids(app), archived(app))


def test_retry_after_lost_lease_splits_nothing_off(
    app: Outbox, other_connection: Engine, commit_events: Callable[..., list[int]]
) -> None:
    """A partial retry whose lease was taken over creates no new group or job."""

    def steal_then_retry(batch: Batch[Any]) -> None:
        steal_lease(other_connection)
        batch.retry(batch.events[:1], "later")

    register(app, steal_then_retry)
    commit_events(app.engine, 2)
    claim = claim_group(app)
    run_due_batch_job(app)
    with app.engine.connect() as conn:
        groups = set(conn.execute(select(ActivityEvent.group_id)).scalars())
        job_count = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    assert ({claim.group_id}, 1) == (groups, job_count)
