"""Completion: what became of a group, written in one short transaction fenced by its job's
lease: delete the rows (or archive them), deal with the events the handler singled out, delete
the job; or reschedule a failed attempt with the handler's backoff, or dead-letter the group when
its attempts are spent. A write the database refuses for good holds the group as refused."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._core.checks import MAX_WAIT_SECONDS
from outbox._core.faults import (
    AFTER_COMMIT,
    IN_COMPLETION,
    crash_point,
)
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import error_summary, is_missing_table, is_transient
from outbox._engine import limiter as _limiter
from outbox._engine.claimer import LeaseLost, NextClaim
from outbox.app import Outbox
from outbox.batch import Batch
from outbox.fanout import copied_columns
from outbox.flags import done_rows
from outbox.handler import Handler
from outbox.results import (
    DEAD,
    DEFERRED,
    LEASE_LOST,
    REFUSED,
    RETRYING,
    SUCCEEDED,
    THROTTLED,
    BatchResult,
)
from outbox.retry import RetryAfter
from outbox.schema import ArchiveStatus, AttemptOutcome, PauseCause

log = _log.get_logger(__name__)

ERROR_TEXT_LIMIT = 4000
# A deferred group waits what the downstream asked plus up to this fraction of it.
DEFERRAL_JITTER = 0.1


def finish_succeeded(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    batch: Batch[Any],
    then: NextClaim | None = None,
    superseded: Sequence[int] = (),
) -> BatchResult:
    """Finish a group whose handler returned. ``then``: the claim job's next claim, made in
    the same transaction when every event succeeded (told ``committed()`` once it is);
    otherwise left to its caller. ``superseded``: events of the group its batch left out
    (``coalesce=True``), archived as such."""
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts
    discarded = batch.discarded_ids
    spent = job.deferrals >= handler.retry.max_deferrals
    # An ordered handler keeps one group of a key at a time: events it retries and defers in
    # one call go on together, as a failed attempt.
    together = handler.ordering_key is not None and len(batch.deferred_ids) < len(batch.retried_ids)
    floor = app.settings.min_retry_after
    asked = {i: max(after, floor) for i, after in batch.deferred_ids.items()}
    deferred = {} if spent or together else asked
    retried = {i: r for i, r in batch.retried_ids.items() if i not in deferred}
    if spent:
        spent_note = f" (its {handler.retry.max_deferrals} deferrals are spent)"
        retried.update({i: retried[i] + spent_note for i in asked})
    # Deferred events retried as a failed attempt still wait no less than they were asked to.
    after = max(asked.values(), default=0.0) if not deferred else 0.0
    give_up_retried = handler.retry.exhausted(attempt)

    # Every event succeeded: the group is finished in one statement where the database can,
    # and the next claim, if offered, rides with it.
    whole = not (discarded or retried or deferred or superseded)
    chained = then if whole else None
    rode = False  # the next claim was made in the transaction that committed

    def claim_next(conn: Connection) -> None:
        nonlocal rode
        if chained is None:
            return
        try:
            chained(conn)
        except DBAPIError:
            raise  # retried with the finish when transient; refused, see below
        except Exception as error:
            raise _ClaimFailed from error
        rode = True

    def work(conn: Connection, lenient: bool = False) -> BatchResult:
        nonlocal rode
        rode = False
        if whole and app.supports.one_statement_completion and not handler.tables[1:]:
            return finish_whole_group(conn, lenient)
        if not queries.delete_job(conn, job.id, job.lease_token):
            raise LeaseLost
        crash_point(IN_COMPLETION)
        if (source := handler.flags) is not None:  # the rows handled lose their flags
            handled = done_rows(batch, [*retried, *deferred])
            queries.clear_flags(conn, source, handled)
        for reason, ids in _by_reason(discarded).items():
            archive_events(
                conn,
                app,
                handler,
                group_id,
                ArchiveStatus.DISCARDED,
                attempt,
                reason,
                ids,
                lenient=lenient,
            )
        if superseded:
            archive_events(
                conn,
                app,
                handler,
                group_id,
                ArchiveStatus.SUPERSEDED,
                attempt,
                None,
                list(superseded),
                lenient=lenient,
            )
        dead = 0
        delays: list[float] = []
        if retried and give_up_retried:
            hold_keys(conn, app, handler, group_id, list(retried), "retried events dead")
            for reason, ids in _by_reason(retried).items():
                dead += archive_events(
                    conn,
                    app,
                    handler,
                    group_id,
                    ArchiveStatus.DEAD,
                    attempt,
                    reason,
                    ids,
                    lenient=lenient,
                )
        elif retried:
            delay = max(handler.retry.delay(attempt), after)
            delays.append(delay)
            split_group(
                conn, handler, group_id, retried, attempts=attempt, delay=delay,
                deferrals=job.deferrals,
            )  # fmt: skip
        if deferred:
            # Put off, not failed: the attempt is not counted for them (see RetryAfter).
            delays.append(deferral_delay(max(deferred.values())))
            split_group(
                conn,
                handler,
                group_id,
                {i: batch.retried_ids[i] for i in deferred},
                attempts=attempt - 1,
                delay=delays[-1],
                deferrals=job.deferrals + 1,
            )
        if handler.archive:
            queries.archive_group_rows(
                conn,
                app.dialect,
                handler.table,
                handler=handler.name,
                group_id=group_id,
                status=ArchiveStatus.SUCCEEDED,
                attempts=attempt,
                error=None,
                lenient=lenient,
            )
        if handler.copy_to and batch.ids:
            columns = copied_columns(handler.table)
            for model in handler.copy_to:
                queries.copy_group_rows(
                    conn, handler.table, model.__table__, group_id, columns, max(batch.ids)
                )
        remaining = queries.delete_group_rows(conn, handler.table, group_id)
        claim_next(conn)
        return BatchResult(
            handler=handler.name,
            group_id=group_id,
            attempt=attempt,
            outcome=SUCCEEDED,
            succeeded=remaining,
            retried=0 if give_up_retried else len(retried),
            deferred=len(deferred),
            discarded=len(discarded),
            dead=dead,
            superseded=len(superseded),
            due_in=min(delays, default=None),
        )

    def finish_whole_group(conn: Connection, lenient: bool) -> BatchResult:
        # Every event succeeded: the job, the rows and their archive in one statement.
        succeeded = queries.finish_succeeded_group(
            conn,
            handler.table,
            job_id=job.id,
            token=job.lease_token,
            group_id=group_id,
            size=len(batch),
            archive=(handler.name, attempt) if handler.archive else None,
            lenient=lenient,
        )
        if succeeded is None:
            raise LeaseLost
        crash_point(IN_COMPLETION)
        claim_next(conn)
        return BatchResult(handler.name, group_id, attempt, SUCCEEDED, succeeded=succeeded)

    try:
        if chained is None:
            result = fenced(app, handler, job, work)
        else:
            with chained.turn:
                result = fenced(app, handler, job, work)
    except _ClaimFailed:
        # The claim riding with the finish failed (not the database: that is retried, or
        # refused below): the handled group is finished alone, and the claim left to the
        # caller, whose own claim meets the same failure and says so.
        return finish_succeeded(app, handler, job, batch)
    except FinishRefused:
        if chained is not None:
            # The refusal may have been the next claim's: the group is finished alone, and the
            # claim left to the caller, as though none had been offered.
            return finish_succeeded(app, handler, job, batch)
        # The archive refused an event's exact form; the handler did succeed: record that,
        # keeping such rows in the lenient form.
        return fenced(app, handler, job, lambda conn: work(conn, lenient=True))
    if rode and then is not None:
        then.committed()
    return result


def finish_failed(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    error: str,
    *,
    give_up: bool,
    at_least: float = 0.0,
    split_off: list[int] | None = None,
    unclaim: list[int] | None = None,
) -> BatchResult:
    """Record a failed attempt: the group waits for its next attempt with the handler's backoff
    (``at_least`` seconds at least), or is dead-lettered when ``give_up``. Bisection:
    ``split_off``, ids of events that go on in a group of their own, with the same attempts
    and wait; ``unclaim``, ids of events that go back to the buffer (an ordered handler's,
    behind the earlier events of their keys)."""
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts

    def work(conn: Connection, lenient: bool = False) -> BatchResult:
        if give_up:
            if not queries.delete_job(conn, job.id, job.lease_token):
                raise LeaseLost
            record_attempt(conn, handler, job, AttemptOutcome.DEAD, error)
            hold_keys(conn, app, handler, group_id, None, error)
            dead = archive_events(
                conn,
                app,
                handler,
                group_id,
                ArchiveStatus.DEAD,
                attempt,
                error,
                None,
                lenient=lenient,
            )
            queries.delete_group_rows(conn, handler.table, group_id)
            return BatchResult(handler.name, group_id, attempt, DEAD, dead=dead, error=error)
        delay = max(handler.retry.delay(attempt), at_least)
        if unclaim:
            queries.unclaim_rows(conn, handler.table, group_id, unclaim)
        if split_off:
            events = dict.fromkeys(split_off, error)
            split_group(
                conn, handler, group_id, events, attempts=attempt, delay=delay,
                deferrals=job.deferrals,
            )  # fmt: skip
        if not queries.release_job(conn, job.id, job.lease_token, delay_seconds=delay, error=error):
            raise LeaseLost
        record_attempt(conn, handler, job, AttemptOutcome.FAILED, error)
        return BatchResult(handler.name, group_id, attempt, RETRYING, error=error, due_in=delay)

    try:
        return fenced(app, handler, job, work)
    except FinishRefused:
        if not give_up:
            raise
    try:
        # The archive refused an event's exact form: keep the row in the lenient one instead.
        return fenced(app, handler, job, lambda conn: work(conn, lenient=True))
    except FinishRefused as refused:
        if is_missing_table(refused.error):
            raise
        return hold_refused(app, handler, job, DEAD, refused)


def finish_deferred(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    retry_after: RetryAfter,
    keys: Sequence[Any] = (),
) -> BatchResult:
    """The downstream refused the whole group for now and said when to come back: the group
    waits that long, its attempt not counted, and so does the handler (see :func:`_hold`;
    ``keys``: the group's ``rate_limit_key`` values). Past ``max_deferrals``, the attempt
    counts as a failed one, after the same wait."""
    assert job.group_id is not None
    group_id = job.group_id
    seconds = max(retry_after.seconds, app.settings.min_retry_after)
    error = f"{RetryAfter.__name__}: {retry_after}"[:ERROR_TEXT_LIMIT]
    if job.deferrals >= handler.retry.max_deferrals:
        error = f"{error} (its {handler.retry.max_deferrals} deferrals are spent)"
        give_up = handler.retry.exhausted(job.attempts)
        result = finish_failed(app, handler, job, error, give_up=give_up, at_least=seconds)
        run_in_transaction(app.engine, lambda conn: _hold(conn, app, handler, keys, seconds, error))
        return replace(result, retry_after=seconds)

    def work(conn: Connection) -> BatchResult:
        delay = deferral_delay(seconds)
        if not queries.defer_job(conn, job.id, job.lease_token, delay_seconds=delay, error=error):
            raise LeaseLost
        record_attempt(conn, handler, job, AttemptOutcome.DEFERRED, error)
        _hold(conn, app, handler, keys, seconds, error)
        return BatchResult(
            handler.name,
            group_id,
            job.attempts,
            DEFERRED,
            error=error,
            retry_after=seconds,
            due_in=delay,
        )

    return fenced(app, handler, job, work)


def finish_throttled(
    app: Outbox, handler: Handler[Any], job: queries.JobRow, seconds: float
) -> BatchResult:
    """The handler's rate limit had no turn for the group soon enough: it goes back, not
    attempted, due again when its turn may have come."""
    assert job.group_id is not None
    group_id = job.group_id

    def work(conn: Connection) -> BatchResult:
        if not queries.return_job(conn, job.id, job.lease_token, delay_seconds=seconds):
            raise LeaseLost
        return BatchResult(handler.name, group_id, job.attempts - 1, THROTTLED, due_in=seconds)

    return fenced(app, handler, job, work)


def deferral_delay(seconds: float) -> float:
    """The wait of a deferred group: what the downstream asked (floored by the caller at
    ``Settings.min_retry_after``), and up to a tenth more, so that groups deferred together do
    not all come back at the same moment."""
    return min(seconds * (1 + DEFERRAL_JITTER * random.random()), max(seconds, MAX_WAIT_SECONDS))


def pauses_on_retry_after(handler: Handler[Any]) -> bool:
    """Whether a whole group's Retry-After pauses ``handler`` (see :func:`_hold`): unless every
    limit it has is per key, when it holds back only the group's keys."""
    limits = handler.rate_limits
    return not limits or any(limit.key is None for limit in limits)


def _hold(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    keys: Sequence[Any],
    seconds: float,
    why: str,
) -> None:
    """A whole group's Retry-After holds back what the downstream limits. With per-key limits
    (``rate_limit_key``) that is the group's keys, for ``seconds``: one tenant's 429 does not
    stop the others. Otherwise it is the handler, paused fleet-wide: every other group would get
    the same answer. An automatic pause only ever extends a pause."""
    if not pauses_on_retry_after(handler):
        _limiter.hold_back(conn, app, handler, keys, seconds)
        return
    queries.pause_handler(
        conn,
        app.dialect,
        handler.name,
        seconds=seconds,
        cause=PauseCause.RETRY_AFTER,
        reason=why,
        only_to_extend=True,
    )


def split_group(
    conn: Connection,
    handler: Handler[Any],
    group_id: uuid.UUID,
    events: dict[int, str],
    *,
    attempts: int,
    delay: float,
    deferrals: int = 0,
) -> None:
    """Move ``events`` (id -> why) of a group into a new group with a batch job of its own,
    due after ``delay`` seconds: events a handler retried or deferred, or half a group being
    bisected."""
    new_group = uuid.uuid4()
    queries.move_rows_to_group(conn, handler.table, group_id, new_group, events)
    queries.insert_batch_job(
        conn,
        handler=handler.name,
        group_id=new_group,
        priority=handler.urgency.priority,
        attempts=attempts,
        deferrals=deferrals,
        delay_seconds=delay,
        error="; ".join(sorted(set(events.values())))[:ERROR_TEXT_LIMIT],
    )


def hold_keys(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    group_id: uuid.UUID,
    ids: list[int] | None,
    error: str | None,
) -> None:
    """An ordered handler's events are about to be dead-lettered (all of the group, or
    ``ids``): hold their keys, so that the keys' later events wait for an operator instead of
    overtaking them."""
    if handler.ordering_key is None:
        return
    keys = queries.group_keys(conn, handler.table, handler.ordering_key, group_id, ids)
    queries.hold_keys(conn, app.dialect, handler.name, keys, group_id, error)


def hold_refused(
    app: Outbox, handler: Handler[Any], job: queries.JobRow, outcome: str, refused: FinishRefused
) -> BatchResult:
    """Hold the job of a group whose finishing write the database refused for good (a value it
    will not take, a constraint, a trigger, a statement it cannot run): retried, the write
    would fail again, and a group that succeeded would be delivered again and again, a dead one
    attempted past its last attempt. ``outcome``: what the write was to record, ``succeeded``
    or ``dead``. See :func:`hold_group`."""
    return hold_group(
        app, handler, job, f"the database refused to record this group as {outcome}: {refused}"
    )


def hold_group(app: Outbox, handler: Handler[Any], job: queries.JobRow, error: str) -> BatchResult:
    """Hold a leased group as refused, with ``error``: it runs nowhere until an operator
    releases it (``outbox refused release``) once the cause is fixed; ``outbox status`` and
    ``outbox check`` show it."""
    assert job.group_id is not None
    group_id = job.group_id
    error = error[:ERROR_TEXT_LIMIT]

    def work(conn: Connection) -> BatchResult:
        if not queries.hold_refused_job(conn, job.id, job.lease_token, error):
            raise LeaseLost
        record_attempt(conn, handler, job, AttemptOutcome.REFUSED, error)
        return BatchResult(handler.name, group_id, job.attempts, REFUSED, error=error)

    return fenced(app, handler, job, work)


class FinishRefused(Exception):  # noqa: N818 - an outcome between two library functions
    """The database refused a finishing write for good (not contention, not a lost lease)."""

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(error_summary(error))
        self.error = error


def record_attempt(
    conn: Connection,
    handler: Handler[Any],
    job: queries.JobRow,
    outcome: AttemptOutcome,
    error: str | None,
) -> None:
    """Record how an attempt of the job's group ended, for ``outbox show``: in the transaction
    that records the outcome, so that the history and the group agree."""
    assert job.group_id is not None
    queries.record_attempt(
        conn,
        handler=handler.name,
        group_id=job.group_id,
        attempt=job.attempts,
        outcome=outcome.value,
        worker=job.lease_owner,
        error=error,
    )


class _ClaimFailed(Exception):  # noqa: N818 - an outcome, as LeaseLost is
    """Raised in a finish's transaction to roll it back when the claim riding with it raised
    what is not a database error: the handled group must not be held for the next group's
    failure."""


def fenced(app: Outbox, handler: Handler[Any], job: queries.JobRow, work: Any) -> BatchResult:
    try:
        # A completion waits out a database restart for as long as its lease could last.
        result: BatchResult = run_in_transaction(
            app.engine, work, patience=app.settings.lease_seconds
        )
        crash_point(AFTER_COMMIT)
    except LeaseLost:
        return lease_lost(handler, job)
    except DBAPIError as error:
        if is_transient(error):
            raise
        raise FinishRefused(error) from error
    return result


def lease_lost(handler: Handler[Any], job: queries.JobRow) -> BatchResult:
    assert job.group_id is not None
    log.warning(
        _log.LEASE_LOST,
        handler=handler.name,
        group_id=str(job.group_id),
        job_id=job.id,
        attempt=job.attempts,
    )
    return BatchResult(handler.name, job.group_id, job.attempts, LEASE_LOST)


def archive_events(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    group_id: uuid.UUID,
    status: str,
    attempt: int,
    error: str | None,
    ids: list[int] | None,
    *,
    lenient: bool = False,
    older_than: float | None = None,
) -> int:
    """Archive rows of a group (all, ``ids``, or those older than ``older_than`` seconds) with
    a status, and delete them from the buffer."""
    archived = queries.archive_group_rows(
        conn,
        app.dialect,
        handler.table,
        handler=handler.name,
        group_id=group_id,
        status=status,
        attempts=attempt,
        error=error,
        event_ids=ids,
        lenient=lenient,
        older_than=older_than,
    )
    queries.delete_group_rows(conn, handler.table, group_id, ids, older_than=older_than)
    return archived


def _by_reason(outcomes: dict[int, str]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for event_id, reason in outcomes.items():
        grouped[reason[:ERROR_TEXT_LIMIT]].append(event_id)
    return grouped
