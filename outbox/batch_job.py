"""The batch job: handles one group.

Load the group's rows (ordered by id), call the handler with no framework transaction open,
then finish in one short transaction fenced by the job's lease: delete the rows (or archive
them), deal with the events the handler singled out, and delete the job. A failed attempt is
rescheduled with the handler's backoff, or dead-lettered when the attempts are spent.
"""

from __future__ import annotations

import datetime as dt
import time
import traceback
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox import _invoke, _log, _sql
from outbox._db import run_in_transaction
from outbox._dialects import error_summary, is_missing_table, is_transient
from outbox._faults import (
    AFTER_COMMIT,
    AFTER_HANDLER,
    BEFORE_HANDLER,
    IN_COMPLETION,
    crash_point,
)
from outbox._invoke import HandlerAbandoned
from outbox.app import Delivery, Handler, Outbox
from outbox.batch import Batch, column_values
from outbox.claimer import LeaseLost
from outbox.exceptions import HandlerTimeoutError
from outbox.schema import ArchiveStatus

log = _log.get_logger(__name__)

ERROR_TEXT_LIMIT = 4000


class Outcome(StrEnum):
    """What became of one batch job."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    """The attempt failed; the next one is scheduled."""
    DEAD = "dead"
    LEASE_LOST = "lease_lost"
    """Another worker had taken the job: nothing was changed."""
    REFUSED = "refused"
    """The database refused to record the outcome for good: the group is held."""


SUCCEEDED, RETRYING, DEAD = Outcome.SUCCEEDED, Outcome.RETRYING, Outcome.DEAD
LEASE_LOST, REFUSED = Outcome.LEASE_LOST, Outcome.REFUSED


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What became of one batch job."""

    handler: str
    group_id: uuid.UUID
    attempt: int
    outcome: Outcome
    size: int = 0
    succeeded: int = 0
    retried: int = 0
    discarded: int = 0
    dead: int = 0
    expired: int = 0
    duration: float = 0.0
    error: str | None = None
    created_at: tuple[dt.datetime, ...] = ()
    """When each handed-over event was created (database clock, UTC)."""
    finished_at: dt.datetime | None = None
    """When the batch was finished (worker clock, UTC)."""
    promise: float = 0.0
    """The promise of the handler's urgency band, in seconds."""

    @property
    def event_ages(self) -> tuple[float, ...]:
        """Seconds from each handed-over event's creation to the end of its batch.

        Computed when asked (by the metrics), not for every batch: a thousand datetime
        subtractions per batch are a cost the plain worker does not need to pay.
        """
        if self.finished_at is None:
            return ()
        end = self.finished_at
        return tuple((end - _utc(created)).total_seconds() for created in self.created_at)

    @property
    def lateness(self) -> float | None:
        """How much later than its band's promise the oldest event was finished (< 0: early)."""
        if self.finished_at is None or not self.created_at:
            return None
        # One batch comes from one database: all naive or all aware, so min() compares them.
        oldest = (self.finished_at - _utc(min(self.created_at))).total_seconds()
        return oldest - self.promise


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; outbox writes them in UTC.
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def format_error(error: BaseException) -> str:
    """Type, message and a truncated traceback: what the archive and the job keep of a failure.

    A database error, or a failure caused by one, keeps only its summary (see
    :func:`outbox._dialects.error_summary`): its full text may quote event values.
    """
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, DBAPIError):
            return error_summary(cause)[:ERROR_TEXT_LIMIT]
        cause = cause.__cause__ or cause.__context__
    text = "".join(traceback.format_exception(error))
    try:
        message = str(error)
    except Exception:  # an exception whose __str__ fails still fails its attempt, by its type
        message = "<exception str() failed>"
    head = f"{type(error).__qualname__}: {message}"
    text = f"{head}\n{text}" if not text.startswith(head) else text
    if len(text) > ERROR_TEXT_LIMIT:
        text = text[: ERROR_TEXT_LIMIT // 2] + "\n...\n" + text[-ERROR_TEXT_LIMIT // 2 :]
    return text


def load_rows(app: Outbox, handler: Handler[Any], group_id: uuid.UUID) -> list[Any]:
    """The group's rows, ordered by id (model instances are built only if the handler asks)."""
    with app.engine.connect() as conn:
        return _sql.select_group_rows(conn, handler.table, group_id)


def run_batch_job(
    app: Outbox, handler: Handler[Any], job: _sql.JobRow, preloaded: list[Any] | None = None
) -> BatchResult:
    """Handle the group of a leased batch job and finish it; never raises for handler errors.

    ``preloaded``: the group's rows when the caller has them already (returned by its claim);
    otherwise they are loaded. A table that does not exist when the group is read raises the
    database error, the job still leased: no attempt was made. A table missing when the
    group is finished makes the finishing write fail as any refused write does
    (:class:`FinishRefused` when the group was to be dead-lettered).
    """
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts
    started = time.monotonic()
    rows: list[Any] = []
    expired = 0
    if attempt > handler.retry.max_attempts:
        # A worker died during the last allowed attempt: nothing more may be tried.
        error = job.last_error or "attempts exhausted"
        result = _finish_failed(app, handler, job, error, give_up=True)
    elif handler.delivery is Delivery.AT_MOST_ONCE and _interrupted(job):
        error = (
            f"at most once: attempt {attempt - 1} was interrupted and may have delivered, so the "
            f"group is not run again ({job.last_error})"
        )
        result = _finish_failed(app, handler, job, error, give_up=True)
    else:
        handed_over = False
        try:
            if handler.expires_after is not None:
                expired = _expire(app, handler, job)
                preloaded = None  # some of them may have just expired
            rows = preloaded if preloaded is not None else load_rows(app, handler, group_id)
            batch: Batch[Any] = Batch(
                rows=rows,
                model=handler.model,
                group_id=group_id,
                attempt=attempt,
                handler=handler.name,
            )
            if rows:
                crash_point(BEFORE_HANDLER)
                handed_over = True
                _call(handler, batch)
                crash_point(AFTER_HANDLER)
        except LeaseLost:
            result = _lease_lost(handler, job)
        except HandlerAbandoned:
            # Its stopping worker cancelled it: no outcome is written; the lease expires and the
            # group is rescued, as is every job a stopping worker abandons.
            result = BatchResult(handler.name, group_id, attempt, LEASE_LOST)
        # The handler's failure is this attempt's outcome; SystemExit too (a handler, or a library
        # it calls, that exits): in a worker's thread it would end the thread without a word.
        # KeyboardInterrupt is the operator's, and goes on up.
        except (Exception, SystemExit) as error:
            if not handed_over and is_missing_table(error):
                # The group could not even be read: no attempt of the handler's. The caller
                # gives the job back uncounted (see Worker).
                raise
            text = format_error(error)
            give_up = handler.retry.exhausted(attempt) or (
                handler.delivery is Delivery.AT_MOST_ONCE and isinstance(error, HandlerTimeoutError)
            )
            result = _finish_failed(app, handler, job, text, give_up=give_up)
        else:
            try:
                result = _finish_succeeded(app, handler, job, batch)
            except FinishRefused as refused:
                if not is_missing_table(refused.error):
                    # The handler succeeded but the database will not record it: the group is
                    # held, never handed over again by itself (its events were delivered).
                    result = _hold_refused(app, handler, job, SUCCEEDED, refused)
                else:
                    # Its table went away under it: the failed way, as for any attempt whose
                    # table is missing (see Worker).
                    give_up = handler.retry.exhausted(attempt)
                    result = _finish_failed(app, handler, job, str(refused), give_up=give_up)
    result = replace(
        result,
        size=len(rows) + expired,
        expired=expired,
        duration=time.monotonic() - started,
        created_at=tuple(column_values(rows, "created_at")),
        finished_at=dt.datetime.now(dt.UTC),
        promise=handler.urgency.promise,
    )
    _log_result(result)
    return result


def _interrupted(job: _sql.JobRow) -> bool:
    """Did the previous attempt stop without an outcome (worker lost, handler timed out)?"""
    last = job.last_error or ""
    return job.attempts > 1 and (
        last.startswith(_sql.RESCUED_ERROR) or last.startswith(HandlerTimeoutError.__name__)
    )


def _expire(app: Outbox, handler: Handler[Any], job: _sql.JobRow) -> int:
    """Archive the group's events older than ``expires_after`` as ``expired``; fenced."""
    assert job.group_id is not None
    assert handler.expires_after is not None
    group_id, older_than = job.group_id, handler.expires_after

    def work(conn: Connection) -> int:
        if not _sql.extend_lease(conn, job.id, job.lease_token, app.settings.lease_seconds):
            raise LeaseLost
        reason = f"expired: older than {older_than:g} s when its group was handled"
        return _archive(
            conn, app, handler, group_id, ArchiveStatus.EXPIRED, job.attempts, reason, None,
            older_than=older_than,
        )  # fmt: skip

    return run_in_transaction(app.engine, work, patience=app.settings.lease_seconds)


def _call(handler: Handler[Any], batch: Batch[Any]) -> None:
    """Call the handler, sync or async, within its timeout (see :mod:`outbox._invoke`)."""
    _invoke.call(handler, batch)


def _finish_succeeded(
    app: Outbox, handler: Handler[Any], job: _sql.JobRow, batch: Batch[Any]
) -> BatchResult:
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts
    discarded = batch.discarded_ids
    retried = batch.retried_ids
    give_up_retried = handler.retry.exhausted(attempt)

    def work(conn: Connection, lenient: bool = False) -> BatchResult:
        if app.supports.one_statement_completion and not discarded and not retried:
            return finish_whole_group(conn, lenient)
        if not _sql.delete_job(conn, job.id, job.lease_token):
            raise LeaseLost
        crash_point(IN_COMPLETION)
        for reason, ids in _by_reason(discarded).items():
            _archive(
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
        dead = 0
        if retried and give_up_retried:
            for reason, ids in _by_reason(retried).items():
                dead += _archive(
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
            new_group = uuid.uuid4()
            _sql.move_rows_to_group(conn, handler.table, group_id, new_group, retried)
            _sql.insert_batch_job(
                conn,
                handler=handler.name,
                group_id=new_group,
                priority=handler.urgency.priority,
                attempts=attempt,
                delay_seconds=handler.retry.delay(attempt),
                error="; ".join(sorted(set(retried.values())))[:ERROR_TEXT_LIMIT],
            )
        if handler.archive:
            _sql.archive_group_rows(
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
        remaining = _sql.delete_group_rows(conn, handler.table, group_id)
        return BatchResult(
            handler=handler.name,
            group_id=group_id,
            attempt=attempt,
            outcome=SUCCEEDED,
            succeeded=remaining,
            retried=0 if give_up_retried else len(retried),
            discarded=len(discarded),
            dead=dead,
        )

    def finish_whole_group(conn: Connection, lenient: bool) -> BatchResult:
        # Every event succeeded: the job, the rows and their archive in one statement.
        succeeded = _sql.finish_succeeded_group(
            conn,
            handler.table,
            job_id=job.id,
            token=job.lease_token,
            group_id=group_id,
            archive=(handler.name, attempt) if handler.archive else None,
            lenient=lenient,
        )
        if succeeded is None:
            raise LeaseLost
        crash_point(IN_COMPLETION)
        return BatchResult(handler.name, group_id, attempt, SUCCEEDED, succeeded=succeeded)

    try:
        return _fenced(app, handler, job, work)
    except FinishRefused:
        # The archive refused an event's exact form; the handler did succeed: record that,
        # keeping such rows in the lenient form.
        return _fenced(app, handler, job, lambda conn: work(conn, lenient=True))


def _finish_failed(
    app: Outbox, handler: Handler[Any], job: _sql.JobRow, error: str, *, give_up: bool
) -> BatchResult:
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts

    def work(conn: Connection, lenient: bool = False) -> BatchResult:
        if give_up:
            if not _sql.delete_job(conn, job.id, job.lease_token):
                raise LeaseLost
            dead = _archive(
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
            _sql.delete_group_rows(conn, handler.table, group_id)
            return BatchResult(handler.name, group_id, attempt, DEAD, dead=dead, error=error)
        delay = handler.retry.delay(attempt)
        if not _sql.release_job(conn, job.id, job.lease_token, delay_seconds=delay, error=error):
            raise LeaseLost
        return BatchResult(handler.name, group_id, attempt, RETRYING, error=error)

    try:
        return _fenced(app, handler, job, work)
    except FinishRefused:
        if not give_up:
            raise
    try:
        # The archive refused an event's exact form: keep the row in the lenient one instead.
        return _fenced(app, handler, job, lambda conn: work(conn, lenient=True))
    except FinishRefused as refused:
        if is_missing_table(refused.error):
            raise
        return _hold_refused(app, handler, job, DEAD, refused)


def _hold_refused(
    app: Outbox, handler: Handler[Any], job: _sql.JobRow, outcome: str, refused: FinishRefused
) -> BatchResult:
    """Hold the job of a group whose finishing write the database refused for good (a value it
    will not take, a constraint, a trigger, a statement it cannot run): retried, the write
    would fail again, and a group that succeeded would be delivered again and again, a dead one
    attempted past its last attempt. Held, it runs nowhere until an operator releases it
    (``outbox refused release``) once the cause is fixed; ``outbox status`` and ``outbox
    check`` show it. ``outcome``: what the write was to record, ``succeeded`` or ``dead``."""
    assert job.group_id is not None
    group_id = job.group_id
    error = f"the database refused to record this group as {outcome}: {refused}"
    error = error[:ERROR_TEXT_LIMIT]

    def work(conn: Connection) -> BatchResult:
        if not _sql.hold_refused_job(conn, job.id, job.lease_token, error):
            raise LeaseLost
        return BatchResult(handler.name, group_id, job.attempts, REFUSED, error=error)

    return _fenced(app, handler, job, work)


class FinishRefused(Exception):  # noqa: N818 - an outcome between two library functions
    """The database refused a finishing write for good (not contention, not a lost lease)."""

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(error_summary(error))
        self.error = error


def _fenced(app: Outbox, handler: Handler[Any], job: _sql.JobRow, work: Any) -> BatchResult:
    try:
        # A completion waits out a database restart for as long as its lease could last.
        result: BatchResult = run_in_transaction(
            app.engine, work, patience=app.settings.lease_seconds
        )
        crash_point(AFTER_COMMIT)
    except LeaseLost:
        return _lease_lost(handler, job)
    except DBAPIError as error:
        if is_transient(error):
            raise
        raise FinishRefused(error) from error
    return result


def _lease_lost(handler: Handler[Any], job: _sql.JobRow) -> BatchResult:
    assert job.group_id is not None
    log.warning(
        _log.LEASE_LOST,
        handler=handler.name,
        group_id=str(job.group_id),
        job_id=job.id,
        attempt=job.attempts,
    )
    return BatchResult(handler.name, job.group_id, job.attempts, LEASE_LOST)


def _archive(
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
    archived = _sql.archive_group_rows(
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
    _sql.delete_group_rows(conn, handler.table, group_id, ids, older_than=older_than)
    return archived


def _by_reason(outcomes: dict[int, str]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for event_id, reason in outcomes.items():
        grouped[reason[:ERROR_TEXT_LIMIT]].append(event_id)
    return grouped


def _log_result(result: BatchResult) -> None:
    fields: dict[str, Any] = {
        "handler": result.handler,
        "group_id": str(result.group_id),
        "size": result.size,
        "attempt": result.attempt,
        "outcome": result.outcome,
        "duration": round(result.duration, 4),
    }
    if result.lateness is not None:
        fields["lateness"] = round(result.lateness, 3)
    if result.retried or result.discarded or result.dead or result.expired:
        fields.update(
            retried=result.retried,
            discarded=result.discarded,
            dead=result.dead,
            expired=result.expired,
        )
    if result.outcome in (RETRYING, DEAD, REFUSED) and result.error:
        # The first line only: type and message. The full traceback is stored with the job.
        fields["error"] = result.error.splitlines()[0][:500]
        if result.outcome == REFUSED:
            log.error(_log.BATCH_HANDLED, **fields)
        else:
            log.warning(_log.BATCH_HANDLED, **fields)
    elif result.outcome == LEASE_LOST:
        return
    else:
        log.info(_log.BATCH_HANDLED, **fields)
