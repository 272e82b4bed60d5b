"""outbox_handlers: pauses the whole fleet agrees on, and deferred attempts.

A paused handler's jobs are not leased by any session until the pause ends or is lifted; an
automatic pause (a Retry-After, the circuit breaker) only ever extends a pause; a deferral
gives a job back without counting its attempt. Acquisition reads the pause without locking
it: a session changing a handler's pause does not wait for acquisitions, nor they for it.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Connection, update

from outbox import schema
from outbox._db import queries
from tests._support import JULIANDAY_ERROR
from tests.conformance._database import THREAD_SECONDS, Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    WORKER,
    add_batch_job,
    add_claim_job,
    add_events,
    existing_job,
    lease,
)

RETRY_AFTER = schema.PauseCause.RETRY_AFTER
OPERATOR = schema.PauseCause.OPERATOR


def _pause(
    db: Database,
    seconds: float | None,
    *,
    cause: str = OPERATOR,
    handler: str = HANDLER,
    only_to_extend: bool = False,
) -> bool:
    return db.run(
        lambda conn: queries.pause_handler(
            conn,
            db.dialect,
            handler,
            seconds=seconds,
            cause=cause,
            reason=f"{cause} for {seconds}",
            only_to_extend=only_to_extend,
        )
    )


def _acquire(conn: Connection, db: Database) -> list[int]:
    jobs = queries.acquire_jobs(
        conn,
        db.dialect,
        handlers=[HANDLER, OTHER_HANDLER],
        worker_id=WORKER,
        token=uuid.uuid4(),
        limit=10,
        lease_seconds=30.0,
    )
    return sorted(job.id for job in jobs)


def _states(db: Database) -> dict[str, queries.HandlerState]:
    return db.run(queries.handler_states)


def test_a_paused_handlers_jobs_are_not_acquired_others_are(db: Database) -> None:
    paused = [add_batch_job(db.engine), add_claim_job(db.engine, 0)]
    other = add_batch_job(db.engine, handler=OTHER_HANDLER)
    _pause(db, None)
    assert ([other], paused) == (db.run(lambda conn: _acquire(conn, db)), sorted(paused))
    assert [None, None] == [existing_job(db.engine, i)["lease_token"] for i in paused]


def test_a_resumed_handlers_jobs_are_acquired(db: Database) -> None:
    job_id = add_batch_job(db.engine)
    _pause(db, None)
    db.run(lambda conn: queries.resume_handler(conn, HANDLER))
    assert [job_id] == db.run(lambda conn: _acquire(conn, db))


def test_a_pause_that_has_ended_holds_nothing(db: Database) -> None:
    job_id = add_batch_job(db.engine)
    _pause(db, 0.2)
    held = db.run(lambda conn: _acquire(conn, db))
    time.sleep(0.3)
    assert ([], [job_id]) == (held, db.run(lambda conn: _acquire(conn, db)))


def test_handler_states_say_who_paused_and_for_how_long(db: Database) -> None:
    _pause(db, 60, cause=RETRY_AFTER)
    _pause(db, None, handler=OTHER_HANDLER)
    states = _states(db)
    mine, other = states[HANDLER], states[OTHER_HANDLER]
    assert (mine.paused, mine.cause, mine.reason) == (True, RETRY_AFTER, "retry_after for 60")
    assert 59 < (mine.paused_for or 0) <= 60
    assert (other.paused, other.paused_for, other.cause) == (True, None, OPERATOR)


def test_resume_ends_the_pause_and_says_whether_there_was_one(db: Database) -> None:
    _pause(db, None)
    first = db.run(lambda conn: queries.resume_handler(conn, HANDLER))
    second = db.run(lambda conn: queries.resume_handler(conn, HANDLER))
    state = _states(db)[HANDLER]
    assert (True, False) == (first, second)
    assert (state.paused, state.cause, state.reason, state.failures, state.trips) == (
        False,
        None,
        None,
        0,
        0,
    )


def test_an_automatic_pause_only_extends(db: Database) -> None:
    """Shorter than the pause in place, or than a pause with no end: nothing changes."""
    assert _pause(db, 60, cause=RETRY_AFTER, only_to_extend=True)
    assert not _pause(db, 10, cause=RETRY_AFTER, only_to_extend=True)
    assert _pause(db, 120, cause=RETRY_AFTER, only_to_extend=True)
    # SQLite's julianday() arithmetic is off by up to some 50 µs: read in the millisecond the
    # pause was written, 120 can come back as 120.00003.
    assert 110 < (_states(db)[HANDLER].paused_for or 0) <= 120 + JULIANDAY_ERROR
    _pause(db, None)
    assert not _pause(db, 600, cause=RETRY_AFTER, only_to_extend=True)
    assert (OPERATOR, None) == (_states(db)[HANDLER].cause, _states(db)[HANDLER].paused_for)


def test_an_automatic_pause_replaces_one_that_has_ended(db: Database) -> None:
    _pause(db, 0.1)
    time.sleep(0.2)
    assert _pause(db, 30, cause=RETRY_AFTER, only_to_extend=True)
    assert RETRY_AFTER == _states(db)[HANDLER].cause


def test_defer_job_gives_it_back_later_its_attempt_uncounted(db: Database) -> None:
    job_id = add_batch_job(db.engine, attempts=2)
    token = lease(db.engine, job_id)
    deferred = db.run(
        lambda conn: queries.defer_job(conn, job_id, token, delay_seconds=30, error="429")
    )
    row = existing_job(db.engine, job_id)
    assert (True, 2, 1, None, "429") == (
        deferred,
        row["attempts"],
        row["deferrals"],
        row["lease_token"],
        row["last_error"],
    )
    assert 29 < db.seconds_from_now(row["run_at"]) <= 30


def test_defer_job_is_fenced_by_the_lease(db: Database) -> None:
    job_id = add_batch_job(db.engine)
    lease(db.engine, job_id)
    stale = uuid.uuid4()
    assert not db.run(
        lambda conn: queries.defer_job(conn, job_id, stale, delay_seconds=30, error="429")
    )
    assert 0 == existing_job(db.engine, job_id)["deferrals"]


def test_acquisition_does_not_wait_for_a_pause_being_written(row_locks: Database) -> None:
    """A session that has written a pause and not committed it blocks no acquisition, and the
    pause counts from its commit."""
    db = row_locks
    first, second = add_batch_job(db.engine), add_batch_job(db.engine)
    _pause(db, 0)  # the handler's row exists, its pause over
    with db.other_engine().connect() as writer:
        queries.pause_handler(
            writer, db.dialect, HANDLER, seconds=None, cause=OPERATOR, reason="uncommitted"
        )
        before_commit = db.run(lambda conn: _acquire_one(conn, db))
        writer.commit()
    after_commit = db.run(lambda conn: _acquire_one(conn, db))
    assert ([first], []) == (before_commit, after_commit)
    assert existing_job(db.engine, second)["lease_token"] is None


def _acquire_one(conn: Connection, db: Database) -> list[int]:
    jobs = queries.acquire_jobs(
        conn,
        db.dialect,
        handlers=[HANDLER],
        worker_id=WORKER,
        token=uuid.uuid4(),
        limit=1,
        lease_seconds=30.0,
    )
    return [job.id for job in jobs]


# --- the handler row's lock: the breaker's count, an ordered handler's claims -----------------


def test_a_second_session_locking_a_handler_waits_for_the_first(row_locks: Database) -> None:
    """What the circuit breaker's count and an ordered handler's claims stand on: a second
    session locking the handler's row waits until the first one commits, then sees its
    writes."""
    db = row_locks
    with db.other_engine().connect() as first:
        queries.lock_handler_state(first, db.dialect, HANDLER)
        queries.set_breaker_counts(first, HANDLER, failures=3, trips=0)
        second = db.in_thread(
            lambda: db.run(lambda conn: queries.lock_handler_state(conn, db.dialect, HANDLER))
        )
        db.wait_for_lock_waiter()
        waiting = not second.done()
        first.commit()
        seen = second.result(THREAD_SECONDS)
    assert (True, 3) == (waiting, seen.failures)


def test_two_ordered_claims_at_once_never_take_one_keys_events_side_by_side(
    row_locks: Database,
) -> None:
    """Both sessions claim in order (the handler's lock, then the claim): the second waits for
    the first, then finds the key's events in a group, and takes nothing of that key."""
    db = row_locks
    add_events(db.engine, 4)  # activity ids 0..3
    with db.engine.begin() as conn:
        conn.execute(update(ACTIVITY).values(activity_id=7))  # one key for all four
    in_order = queries.in_order(ACTIVITY, "activity_id", HANDLER)

    def ordered_claim(conn: Connection) -> int:
        queries.lock_handler_state(conn, db.dialect, HANDLER)
        return queries.claim_rows(conn, db.dialect, ACTIVITY, uuid.uuid4(), 2, in_order)

    with db.other_engine().connect() as first:
        took_first = ordered_claim(first)
        second = db.in_thread(lambda: db.run(ordered_claim))
        db.wait_for_lock_waiter()
        first.commit()
        took_second = second.result(THREAD_SECONDS)
    assert (2, 0) == (took_first, took_second)


# --- a write that needs the handler paused throughout (a fan-out consumer's backfill) ---------


def _record(db: Database, selection: str = "{}") -> int:
    return db.run(
        lambda conn: queries.record_operation(
            conn, action="replay", actor="test", selection=selection, groups=0, events=0,
            detail=None,
        )
    )  # fmt: skip


def test_lock_pause_says_whether_the_handler_is_paused_now(db: Database) -> None:
    """Paused; a pause that has ended; never paused (no row); resumed."""
    _pause(db, None)
    _pause(db, 0.1, handler=OTHER_HANDLER)
    time.sleep(0.2)
    names = (HANDLER, OTHER_HANDLER, "none")
    paused = [db.run(lambda conn, n=n: queries.lock_pause(conn, n)) for n in names]
    db.run(lambda conn: queries.resume_handler(conn, HANDLER))
    assert ([True, False, False], False) == (
        paused,
        db.run(lambda conn: queries.lock_pause(conn, HANDLER)),
    )


def test_a_resume_waits_for_the_session_holding_the_pause(row_locks: Database) -> None:
    """A session that checked the pause holds it: a resume waits until it commits, so that
    what it wrote was written while the handler was paused."""
    db = row_locks
    _pause(db, None)
    with db.other_engine().connect() as first:
        held = queries.lock_pause(first, HANDLER)
        resume = db.in_thread(lambda: db.run(lambda conn: queries.resume_handler(conn, HANDLER)))
        db.wait_for_lock_waiter()
        waiting = not resume.done()
        first.commit()
        resumed = resume.result(THREAD_SECONDS)
    assert (True, True, True) == (held, waiting, resumed)


def test_paused_since_operation_is_a_pause_begun_before_the_record(db: Database) -> None:
    """Paused before the operation was recorded: yes; resumed since, or paused again after
    it: no."""
    _pause(db, None)
    time.sleep(0.01)
    recorded = _record(db)
    before = db.run(lambda conn: queries.paused_since_operation(conn, HANDLER, recorded))
    db.run(lambda conn: queries.resume_handler(conn, HANDLER))
    resumed = db.run(lambda conn: queries.paused_since_operation(conn, HANDLER, recorded))
    time.sleep(0.01)
    _pause(db, None)
    again = db.run(lambda conn: queries.paused_since_operation(conn, HANDLER, recorded))
    assert (True, False, False) == (before, resumed, again)


def test_last_operation_is_the_newest_of_that_action_and_selection(db: Database) -> None:
    """The newest record of exactly that selection; None for a selection never recorded."""
    _record(db, '{"backfill": "a"}')
    newest = _record(db, '{"backfill": "a"}')
    _record(db, '{"backfill": "b"}')
    found = db.run(
        lambda conn: queries.last_operation(conn, action="replay", selection='{"backfill": "a"}')
    )
    never = db.run(
        lambda conn: queries.last_operation(conn, action="edit", selection='{"backfill": "a"}')
    )
    assert (newest, "test", None) == (found and found.id, found and found.actor, never)
