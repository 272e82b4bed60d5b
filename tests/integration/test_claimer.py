"""The claimer: stamps one group on the oldest unclaimed rows and enqueues its batch job."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, event, func, select
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, Urgency, schema
from outbox._engine import claimer
from outbox.handler import Handler
from tests.models import ActivityEvent


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    """An application with one handler of batch_size 10."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, urgency=Urgency.MINUTES)(noop)
    return app


@pytest.fixture
def handler(app: Outbox) -> Handler[Any]:
    return app.get_handler("noop")


def group_ids_by_event(app: Outbox) -> dict[int, Any]:
    with app.engine.connect() as conn:
        rows = conn.execute(select(ActivityEvent.id, ActivityEvent.group_id))
        return {event_id: group_id for event_id, group_id in rows}


def claim_one(app: Outbox, handler: Handler[Any]) -> claimer.Claim:
    """Claim a group that must exist."""
    claim = claimer.run_once(app, handler)
    assert claim is not None, "nothing was claimed"
    return claim


def batch_jobs(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.jobs).where(schema.jobs.c.kind == "batch")))


def test_claims_the_oldest_rows_first(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """The group is the batch_size lowest ids; later rows stay unclaimed."""
    ids = commit_events(app.engine, 15)
    claim = claim_one(app, handler)
    claimed = sorted(i for i, g in group_ids_by_event(app).items() if g == claim.group_id)
    assert ids[:10] == claimed


def test_claims_at_most_batch_size(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """A claim over a larger backlog takes exactly batch_size rows."""
    commit_events(app.engine, 25)
    claim = claim_one(app, handler)
    unclaimed = [i for i, g in group_ids_by_event(app).items() if g is None]
    assert (10, 15) == (claim.size, len(unclaimed))


def test_claims_what_there_is_below_batch_size(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """Fewer rows than batch_size make a smaller group."""
    commit_events(app.engine, 3)
    assert 3 == claim_one(app, handler).size


def test_successive_claims_take_disjoint_groups(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """A second claim never takes rows of the first."""
    commit_events(app.engine, 20)
    first = claim_one(app, handler)
    second = claim_one(app, handler)
    sizes = Counter(group_ids_by_event(app).values())
    assert {first.group_id: 10, second.group_id: 10} == sizes


def test_claim_enqueues_the_batch_job_of_its_group(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """The claim writes one batch job for the group, at the handler's priority."""
    commit_events(app.engine, 5)
    claim = claim_one(app, handler)
    (job,) = batch_jobs(app)
    assert (claim.group_id, "noop", Urgency.MINUTES.priority, 0, None) == (
        job.group_id,
        job.handler,
        job.priority,
        job.attempts,
        job.lease_token,
    )


def test_claim_and_batch_job_commit_together(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """If enqueueing the batch job fails, the rows stay unclaimed."""
    commit_events(app.engine, 5)

    @event.listens_for(app.engine, "before_cursor_execute")
    def fail_job_insert(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO outbox_jobs"):
            raise RuntimeError("job insert failed")

    with pytest.raises(RuntimeError, match="job insert failed"):
        claimer.run_once(app, handler)
    assert ({None}, []) == (set(group_ids_by_event(app).values()), batch_jobs(app))


def test_nothing_waiting_returns_none(app: Outbox, handler: Handler[Any]) -> None:
    """An empty buffer is a normal outcome: no claim, no job."""
    assert (None, []) == (claimer.run_once(app, handler), batch_jobs(app))


def test_only_claimed_rows_waiting_returns_none(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """Rows already in a group are not claimed again."""
    commit_events(app.engine, 5)
    claimer.run_once(app, handler)
    assert None is claimer.run_once(app, handler)


@pytest.fixture
def pg_app(make_app: Callable[[str], Outbox], postgres_database: str) -> Outbox:
    """A PostgreSQL application with one handler of batch_size 10."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, batch_size=10)(noop)
    return app


@pytest.fixture
def application_session(postgres_database: str) -> Iterator[Session]:
    """A session of the application on its own connection, left open by the test."""
    engine = create_engine(postgres_database)
    with Session(engine) as session:
        yield session
        session.rollback()
    engine.dispose()


def claim_in_thread(app: Outbox, timeout: float = 10.0) -> claimer.Claim | None:
    """Run a claim in another thread; fail if it does not finish within ``timeout`` seconds."""
    outcome: list[Any] = []
    thread = threading.Thread(
        target=lambda: outcome.append(claimer.run_once(app, app.get_handler("noop")))
    )
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the claim was blocked"
    return outcome[0]  # type: ignore[no-any-return]


def test_claimer_does_not_see_rows_of_an_open_transaction(
    pg_app: Outbox, application_session: Session
) -> None:
    """Events of a transaction still open elsewhere are not claimed, and do not block."""
    application_session.add_all([ActivityEvent(activity_id=n) for n in range(5)])
    application_session.flush()
    assert None is claim_in_thread(pg_app)


def test_claimer_takes_committed_rows_beside_an_open_transaction(
    pg_app: Outbox,
    application_session: Session,
    commit_events: Callable[..., list[int]],
) -> None:
    """Committed events are claimed while another transaction's events stay out of the group."""
    committed = commit_events(pg_app.engine, 3)
    application_session.add_all([ActivityEvent(activity_id=n) for n in range(5)])
    application_session.flush()
    claim = claim_in_thread(pg_app)
    assert claim is not None
    claimed = sorted(i for i, g in group_ids_by_event(pg_app).items() if g == claim.group_id)
    assert committed == claimed


def test_claimer_skips_rows_locked_by_another_transaction(
    pg_app: Outbox,
    application_session: Session,
    commit_events: Callable[..., list[int]],
) -> None:
    """Committed rows locked elsewhere are skipped, not waited for."""
    ids = commit_events(pg_app.engine, 6)
    application_session.execute(
        select(ActivityEvent.id).where(ActivityEvent.id.in_(ids[:3])).with_for_update()
    )
    claim = claim_in_thread(pg_app)
    assert claim is not None
    claimed = sorted(i for i, g in group_ids_by_event(pg_app).items() if g == claim.group_id)
    assert ids[3:] == claimed


def test_rows_of_an_open_transaction_are_claimed_after_commit(
    pg_app: Outbox, application_session: Session
) -> None:
    """Once the application commits, its events are claimed as usual."""
    application_session.add_all([ActivityEvent(activity_id=n) for n in range(5)])
    application_session.flush()
    claim_in_thread(pg_app)
    application_session.commit()
    claim = claim_in_thread(pg_app)
    assert 5 == (claim.size if claim else 0)


def captured_sql(app: Outbox, run: Callable[[], object]) -> list[str]:
    """Every statement ``run`` sends through the application's engine."""
    sent: list[str] = []

    def capture(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(app.engine, "before_cursor_execute", capture)
    try:
        run()
    finally:
        event.remove(app.engine, "before_cursor_execute", capture)
    return sent


def test_postgresql_claim_is_sent_as_a_locking_cte(
    pg_app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """The claim PostgreSQL receives is WITH ... FOR UPDATE SKIP LOCKED, then an UPDATE by the
    locked rows' addresses."""
    commit_events(pg_app.engine, 3)
    sent = captured_sql(pg_app, lambda: claimer.run_once(pg_app, pg_app.get_handler("noop")))
    (claim,) = [s for s in sent if "UPDATE test_activity_events" in s]
    assert (True, True, True, False) == (
        claim.startswith("WITH claimable AS (SELECT ctid"),
        "FOR UPDATE SKIP LOCKED)" in claim,
        "UPDATE test_activity_events SET group_id=" in claim
        and "WHERE ctid = ANY (array((SELECT claimable.ctid" in claim,
        "IN (SELECT" in claim,
    )


def test_postgresql_job_acquisition_is_sent_as_a_locking_cte(
    pg_app: Outbox, commit_events: Callable[..., list[int]]
) -> None:
    """Leasing jobs on PostgreSQL is a locking CTE too, never IN (SELECT ...)."""
    from outbox.testing import drain

    commit_events(pg_app.engine, 3)
    sent = captured_sql(pg_app, lambda: drain(pg_app))
    leases = [s for s in sent if "UPDATE outbox_jobs SET attempts=" in s]
    not_locking_ctes = [
        s
        for s in leases
        if not s.startswith("WITH picked AS (SELECT")
        or "FOR UPDATE SKIP LOCKED)" not in s
        or "FROM picked" not in s
        or "IN (SELECT" in s
    ]
    assert (True, []) == (len(leases) > 0, not_locking_ctes)


def test_claim_does_not_write_anything_when_nothing_waits(
    app: Outbox, handler: Handler[Any]
) -> None:
    """Finding nothing costs no insert."""
    sent = captured_sql(app, lambda: claimer.run_once(app, handler))
    assert [] == [s for s in sent if s.startswith("INSERT")]


def test_group_count_matches_claim_size(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """The size a claim reports is the number of rows stamped with its group."""
    commit_events(app.engine, 7)
    claim = claim_one(app, handler)
    with app.engine.connect() as conn:
        stamped = conn.execute(
            select(func.count()).where(ActivityEvent.group_id == claim.group_id)
        ).scalar_one()
    assert claim.size == stamped
