"""Claim jobs run by a worker: the claim that keeps claiming, its fence, and how it ends.

On PostgreSQL a claim job's claim is one statement that also extends the job's lease (its
fence) and a group's completion is one statement that also deletes its batch job; these tests
hold both forms to the behaviour of the statement-per-step form the other databases use.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Enum, func, insert, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, schema
from outbox._db import queries, run_in_transaction
from outbox._engine import claimer, distributor
from outbox._engine.batch_job import run_batch_job
from outbox._engine.runner import Runner
from outbox.handler import Handler
from outbox.results import SUCCEEDED
from outbox.testing import drain
from tests.models import ActivityEvent

WORKER = "test-worker"


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


@pytest.fixture
def app(make_app: Callable[[str], Outbox], database_url: str) -> Outbox:
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10)(noop)
    return app


@pytest.fixture
def handler(app: Outbox) -> Handler[Any]:
    return app.get_handler("noop")


def lease_claim_jobs(app: Outbox, limit: int = 100) -> list[queries.JobRow]:
    """Distribute, then lease up to ``limit`` claim jobs to this test's worker."""
    distributor.run_once(app, list(app.handlers))
    return run_in_transaction(
        app.engine,
        lambda conn: queries.acquire_jobs(
            conn,
            app.dialect,
            handlers=list(app.handlers),
            worker_id=WORKER,
            token=uuid.uuid4(),
            limit=limit,
            lease_seconds=60.0,
            kind=schema.JobKind.CLAIM,
        ),
    )


def claim_jobs(app: Outbox) -> list[tuple[int, bool]]:
    """(id, leased) of every claim job."""
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(schema.jobs.c.id, schema.jobs.c.lease_token.is_not(None))
            .where(schema.jobs.c.kind == schema.JobKind.CLAIM)
            .order_by(schema.jobs.c.id)
        )
        return [(job_id, bool(leased)) for job_id, leased in rows]


def unclaimed(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(ActivityEvent.group_id.is_(None))).scalar_one()
        )


def steal(app: Outbox, job: queries.JobRow) -> None:
    """Give the job's lease to someone else, as a rescue and a new lease would."""
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.id == job.id)
            .values(lease_token=uuid.uuid4(), lease_owner="another-worker")
        )


def test_a_kept_claim_job_says_more_while_rows_remain_past_its_batch(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """A full batch with rows left says more; the claim that takes the last rows does not."""
    commit_events(app.engine, 20)
    (job, _) = lease_claim_jobs(app, limit=2)
    first = claimer.run_claim_job(app, handler, job, lease_to=WORKER, keep=True)
    second = claimer.run_claim_job(app, handler, job, lease_to=WORKER, keep=True)
    assert first is not None
    assert second is not None
    assert ((10, True), (10, False), 0) == (
        (first.size, first.more),
        (second.size, second.more),
        unclaimed(app),
    )


def test_a_claim_job_whose_lease_was_lost_claims_nothing(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """The fence: a worker that lost its claim job's lease stamps no row and makes no group."""
    commit_events(app.engine, 5)
    (job,) = lease_claim_jobs(app)
    steal(app, job)
    claim = claimer.run_claim_job(app, handler, job, lease_to=WORKER, keep=True)
    with app.engine.connect() as conn:
        batch_jobs = conn.execute(
            select(func.count()).where(schema.jobs.c.kind == schema.JobKind.BATCH)
        ).scalar_one()
    assert (None, 5, 0, [(job.id, True)]) == (claim, unclaimed(app), batch_jobs, claim_jobs(app))


def test_a_claim_that_drains_the_buffer_deletes_the_pending_claim_jobs(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    """Claim jobs counted for rows now taken would each find nothing: they go with the last
    claim. Another worker's leased claim job stays: its worker finishes it."""
    commit_events(app.engine, 35)
    distributor.run_once(app, list(app.handlers))  # four claim jobs for 35 rows
    mine, theirs = run_in_transaction(
        app.engine,
        lambda conn: queries.acquire_jobs(
            conn,
            app.dialect,
            handlers=["noop"],
            worker_id=WORKER,
            token=uuid.uuid4(),
            limit=2,
            lease_seconds=60.0,
        ),
    )
    sizes = []
    while (claim := claimer.run_claim_job(app, handler, mine, lease_to=WORKER, keep=True)) and (
        claim.more
    ):
        sizes.append(claim.size)
    assert claim is not None
    sizes.append(claim.size)
    assert ([10, 10, 10, 5], [(theirs.id, True)]) == (sizes, claim_jobs(app))


def test_a_completed_group_leaves_no_job_and_no_row(
    app: Outbox, handler: Handler[Any], commit_events: Callable[..., list[int]]
) -> None:
    commit_events(app.engine, 4)
    claim = claimer.run_once(app, handler, lease_to=WORKER)
    assert claim is not None
    assert claim.job is not None
    result = run_batch_job(app, handler, claim.job, preloaded=claim.rows)
    with app.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
        rows = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    assert ((SUCCEEDED, 4), 0, 0) == ((result.outcome, result.succeeded), left, rows)


def test_finishing_a_group_with_a_lost_lease_changes_nothing(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """PostgreSQL's one-statement completion is fenced: another token deletes and archives
    nothing, and says so."""
    app = make_app(postgres_database)
    app.handler(ActivityEvent, batch_size=10, archive=True)(noop)
    commit_events(app.engine, 3)
    claim = claimer.run_once(app, app.get_handler("noop"), lease_to=WORKER)
    assert claim is not None
    assert claim.job is not None

    def finish(token: uuid.UUID) -> int | None:
        return run_in_transaction(
            app.engine,
            lambda conn: queries.finish_succeeded_group(
                conn,
                ActivityEvent.__table__,
                job_id=claim.job.id,  # type: ignore[union-attr]
                token=token,
                group_id=claim.group_id,
                size=claim.size,
                archive=("noop", 1),
            ),
        )

    lost = finish(uuid.uuid4())
    with app.engine.connect() as conn:
        archived_after_lost = conn.execute(
            select(func.count()).select_from(schema.archive)
        ).scalar_one()
    done = finish(claim.job.lease_token)
    with app.engine.connect() as conn:
        archived = conn.execute(
            select(schema.archive.c.status, func.count()).group_by(schema.archive.c.status)
        ).all()
    assert (None, 0, 3, [("succeeded", 3)], 0) == (
        lost,
        archived_after_lost,
        done,
        [tuple(row) for row in archived],
        unclaimed(app),
    )


def test_postgresql_probes_for_unclaimed_rows_use_the_partial_index(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """The count, the any-left probe and the more-rows probe read ``ix_<t>_unclaimed`` even
    with dead rows at the heap's start: a sequential scan would step over them all, slower with
    every group a drain takes."""
    from sqlalchemy import bindparam, delete, select, text

    app = make_app(postgres_database)
    ids = commit_events(app.engine, 5000)
    with app.engine.begin() as conn:
        conn.execute(delete(ActivityEvent).where(ActivityEvent.id <= ids[3999]))
        conn.execute(text("ANALYZE test_activity_events"))
    table = ActivityEvent.__table__
    sent: list[tuple[Any, dict[str, Any]]] = []

    class Recorder:
        """Stands in for a connection: records each statement with its parameters."""

        def execute(self, statement: Any, parameters: dict[str, Any] | None = None) -> Any:
            sent.append((statement, parameters or {}))
            with app.engine.connect() as conn:
                return conn.execute(statement, parameters).all()

    recorder: Any = Recorder()
    for probe in (lambda: queries.count_unclaimed(recorder, table, 100),
                  lambda: queries.any_unclaimed(recorder, table)):  # fmt: skip
        # The recorder returns plain rows, which the probes may not read: only their
        # statements matter here.
        with contextlib.suppress(AttributeError):
            probe()
    more = select(queries.unclaimed_after(table, bindparam("outbox_after_id")))
    sent.append((more, {"outbox_after_id": ids[4000]}))
    plans = []
    with app.engine.connect() as conn:
        for statement, parameters in sent:
            compiled = statement.compile(dialect=conn.dialect)
            values = compiled.construct_params(parameters, _check=False)
            plan = conn.exec_driver_sql(f"EXPLAIN {compiled}", values).scalars()
            plans.append("ix_test_activity_events_unclaimed" in "\n".join(plan))
        conn.rollback()
    assert [True, True, True] == plans


# --- PostgreSQL: the next claim made in the transaction that finishes the group before it -----


def _chaining_app(make_app: Callable[[str], Outbox], url: str, handle: Any) -> Outbox:
    app = make_app(url)
    app.handler(ActivityEvent, batch_size=2, name="noop")(handle)
    return app


def test_a_chained_claim_whose_claim_job_was_lost_lets_the_finish_commit(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """The handler's group is finished though the claim riding with its finish found its claim
    job taken: that claim stamps nothing and makes no batch job, and the rows it would have
    taken wait for the claim job's new holder."""
    handled: list[list[int]] = []

    def handle(batch: Batch[Any]) -> None:
        handled.append(batch.ids)
        with app.engine.begin() as conn:  # while the group is handled, its claim job is rescued
            conn.execute(
                update(schema.jobs)
                .where(schema.jobs.c.kind == schema.JobKind.CLAIM)
                .values(lease_token=uuid.uuid4(), lease_owner="another-worker")
            )

    app = _chaining_app(make_app, postgres_database, handle)
    ids = commit_events(app.engine, 6)
    (job,) = lease_claim_jobs(app, limit=1)
    run = Runner(app, worker_id=WORKER).run(job)
    with app.engine.connect() as conn:
        owners = conn.execute(
            select(schema.jobs.c.kind, schema.jobs.c.lease_owner).distinct()
        ).all()
        left = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    assert ([ids[:2]], (4, 4), [("claim", "another-worker")], [SUCCEEDED]) == (
        handled,
        (left, unclaimed(app)),
        [tuple(owner) for owner in owners],
        [result.outcome for result in run.results],
    )


def test_a_refused_chained_claim_never_holds_the_group_it_rode_with(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """The database refuses every batch job asked for in a transaction that deleted a job
    first, as the claim riding with a group's finish does: each group is finished alone, not
    held as refused, and the claim job goes on claiming; every event is handled once."""
    handled: list[int] = []
    app = _chaining_app(make_app, postgres_database, lambda batch: handled.extend(batch.ids))
    with app.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION note_deleted_job() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN PERFORM set_config('outbox_test.deleted', 'yes', true); RETURN OLD; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER noted AFTER DELETE ON outbox_jobs FOR EACH ROW"
            " EXECUTE FUNCTION note_deleted_job()"
        )
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_batch_job() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.kind = 'batch' AND current_setting('outbox_test.deleted', true) = 'yes'"
            " THEN RAISE EXCEPTION 'refused by a test'; END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse BEFORE INSERT ON outbox_jobs FOR EACH ROW"
            " EXECUTE FUNCTION refuse_batch_job()"
        )
    ids = commit_events(app.engine, 6)
    (job,) = lease_claim_jobs(app, limit=1)
    run = Runner(app, worker_id=WORKER).run(job)
    with app.engine.connect() as conn:
        batch_jobs = conn.execute(
            select(func.count()).where(schema.jobs.c.kind == schema.JobKind.BATCH)
        ).scalar_one()
        left = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    outcomes = [result.outcome for result in run.results]
    assert (ids, [SUCCEEDED] * 3, 0, 0) == (sorted(handled), outcomes, batch_jobs, left)


class _WatchedTurn(threading.BoundedSemaphore):
    """A claims-at-once bound that says when a thread first asks for it, and whether that
    thread's database session was then inside a transaction."""

    def __init__(self, app: Outbox) -> None:
        super().__init__(1)
        self.app = app
        self.asked = threading.Event()
        self.sessions_in_transaction: list[str] | None = None

    def __enter__(self) -> bool:
        if not self.asked.is_set():
            with self.app.engine.connect() as conn:
                self.sessions_in_transaction = list(
                    conn.exec_driver_sql(
                        "SELECT state FROM pg_stat_activity WHERE datname = current_database()"
                        " AND starts_with(state, 'idle in transaction') AND pid <> pg_backend_pid()"
                    ).scalars()
                )
            self.asked.set()
        return super().__enter__()


def test_a_chained_claim_waits_for_its_turn_with_no_transaction_open(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """Waited for inside the finish's transaction, the turn would keep the finished job's row
    locked meanwhile: the heartbeat pushing that job's lease back would wait for it while
    holding other jobs' locks, whose threads hold the turn; a cycle no database can see."""
    app = _chaining_app(make_app, postgres_database, noop)
    commit_events(app.engine, 6)
    (job,) = lease_claim_jobs(app, limit=1)
    handler = app.get_handler("noop")
    claim = claimer.run_claim_job(app, handler, job, lease_to=WORKER, keep=True)
    assert claim is not None
    assert claim.job is not None
    turn = _WatchedTurn(app)
    following = claimer.NextClaim(app, handler, job, WORKER, turn)
    turn.acquire()  # another thread's claim holds the turn
    finishing = threading.Thread(
        target=run_batch_job, args=(app, handler, claim.job, claim.rows, following)
    )
    finishing.start()
    assert turn.asked.wait(30)
    turn.release()
    finishing.join(30)
    assert ([], True, 2) == (
        turn.sessions_in_transaction,
        following.made,
        following.claim.size if following.claim else None,
    )


def test_a_group_claimed_with_a_finish_after_a_stop_goes_back_unattempted(
    postgres_database: str,
    make_app: Callable[[str], Outbox],
    commit_events: Callable[..., list[int]],
) -> None:
    """A worker told to stop while it handles a group does not handle the group claimed with
    that group's finish: its batch job and the claim job go back to the job table, unleased."""
    handled: list[list[int]] = []
    stopping = threading.Event()

    def handle(batch: Batch[Any]) -> None:
        handled.append(batch.ids)
        stopping.set()

    app = _chaining_app(make_app, postgres_database, handle)
    ids = commit_events(app.engine, 6)
    (job,) = lease_claim_jobs(app, limit=1)
    run = Runner(app, worker_id=WORKER, stopping=stopping.is_set).run(job)
    with app.engine.connect() as conn:
        leased = conn.execute(
            select(schema.jobs.c.kind, schema.jobs.c.lease_token.is_not(None))
            .where(schema.jobs.c.kind == schema.JobKind.BATCH)
            .union_all(
                select(schema.jobs.c.kind, schema.jobs.c.lease_token.is_not(None)).where(
                    schema.jobs.c.id == job.id
                )
            )
        ).all()
        left = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    assert ([ids[:2]], True, (4, 2), {("batch", False), ("claim", False)}) == (
        handled,
        run.released,
        (left, unclaimed(app)),
        {tuple(row) for row in leased},
    )


class _UnreadableBase(DeclarativeBase):
    pass


class _Color(enum.Enum):
    RED = "red"


class _ColorEvent(BufferMixin, _UnreadableBase):
    """A buffer whose column's type cannot read a value another writer stored: an Enum member
    since removed from the code."""

    __tablename__ = "test_color_events"
    color: Mapped[_Color] = mapped_column(
        Enum(_Color, native_enum=False, length=10, validate_strings=False)
    )


def test_a_value_a_column_cannot_read_holds_up_no_group_on_any_database(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Two groups of readable events and one whose values the column's type cannot read: the
    readable ones are handled once each; the other is claimed all the same and fails its
    attempt, blocking no row behind it; no group the handler succeeded with is held, not even
    the one whose finish the unreadable claim rode with."""
    app = make_app(database_url)
    handled: list[int] = []
    app.handler(_ColorEvent, batch_size=2, name="colors")(
        lambda batch: handled.extend(e.id for e in batch.events)
    )
    _UnreadableBase.metadata.create_all(app.engine)
    try:
        with app.engine.begin() as conn:
            conn.execute(insert(_ColorEvent.__table__), [{"color": _Color.RED}] * 4)
            conn.exec_driver_sql("INSERT INTO test_color_events (color) VALUES ('green')")
            conn.exec_driver_sql("INSERT INTO test_color_events (color) VALUES ('green')")
            conn.execute(insert(_ColorEvent.__table__), [{"color": _Color.RED}] * 2)
        drain(app)
        with app.engine.connect() as conn:
            held = conn.execute(
                select(func.count()).where(
                    schema.jobs.c.lease_token.is_not(None), schema.jobs.c.lease_expires_at.is_(None)
                )
            ).scalar_one()
            failed = conn.execute(
                select(schema.jobs.c.attempts, schema.jobs.c.last_error).where(
                    schema.jobs.c.kind == schema.JobKind.BATCH
                )
            ).all()
        assert ([1, 2, 3, 4, 7, 8], 0, 1) == (sorted(handled), held, len(failed))
        assert "LookupError" in (failed[0].last_error or "")
    finally:
        _UnreadableBase.metadata.drop_all(app.engine)
