"""The batch job: handles one group.

Load the group's rows (ordered by id), call the handler with no framework transaction open,
then have the completion write what became of the group (``completion``).
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._core.faults import (
    AFTER_HANDLER,
    BEFORE_HANDLER,
    crash_point,
)
from outbox._db import queries, run_in_transaction
from outbox._db.database_clock import database_clock
from outbox._db.dialects import error_summary, is_missing_table
from outbox._engine import invoke as _invoke
from outbox._engine import limiter as _limiter
from outbox._engine.causes import failure_cause
from outbox._engine.claimer import LeaseLost, NextClaim
from outbox._engine.completion import (
    ERROR_TEXT_LIMIT,
    FinishRefused,
    archive_events,
    finish_deferred,
    finish_failed,
    finish_succeeded,
    finish_throttled,
    hold_group,
    hold_refused,
    lease_lost,
)
from outbox._engine.invoke import HandlerAbandoned
from outbox.app import Outbox
from outbox.batch import Batch, column_values
from outbox.exceptions import HandlerTimeoutError
from outbox.handler import Delivery, Handler
from outbox.results import DEAD, DEFERRED, LEASE_LOST, REFUSED, RETRYING, SUCCEEDED, BatchResult
from outbox.retry import RetryAfter
from outbox.schema import ArchiveStatus

log = _log.get_logger(__name__)


def format_error(error: BaseException) -> str:
    """Type, message and a truncated traceback: what the archive and the job keep of a failure.

    A database error, or a failure caused by one, keeps only its summary (see
    :func:`outbox._db.dialects.error_summary`): its full text may quote event values.
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
        return queries.select_group_rows(conn, handler.table, group_id)


def run_batch_job(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    preloaded: Sequence[Any] | None = None,
    then: NextClaim | None = None,
) -> BatchResult:
    """Handle the group of a leased batch job and finish it; never raises for handler errors.

    ``preloaded``: the group's rows when the caller has them already (returned by its claim);
    otherwise they are loaded. ``then``: a claim to make in the transaction that finishes the
    group, if every event succeeded (see ``completion.finish_succeeded``).

    A table that does not exist when the group is read raises the database error, the job
    still leased: no attempt was made. A table missing when the group is finished makes the
    finishing write fail as any refused write does (:class:`FinishRefused` when the group was
    to be dead-lettered).
    """
    assert job.group_id is not None
    group_id = job.group_id
    attempt = job.attempts
    started = time.monotonic()
    rows: Sequence[Any] = []
    superseded: list[int] = []
    expired = 0
    if attempt > handler.retry.max_attempts:
        # A worker died during the last allowed attempt: nothing more may be tried.
        error = job.last_error or "attempts exhausted"
        result = finish_failed(app, handler, job, error, give_up=True)
    elif handler.delivery is Delivery.AT_MOST_ONCE and _interrupted(job):
        error = (
            f"at most once: attempt {attempt - 1} was interrupted and may have delivered, so the "
            f"group is not run again ({job.last_error})"
        )
        result = finish_failed(app, handler, job, error, give_up=True)
    else:
        handed_over = False
        try:
            if handler.expires_after is not None:
                expired = _expire(app, handler, job)
                preloaded = None  # some of them may have just expired
            rows = preloaded if preloaded is not None else load_rows(app, handler, group_id)
            if handler.coalesce:
                rows, superseded = _coalesced(handler, rows)
            batch: Batch[Any] = Batch(
                rows=rows,
                model=handler.model,
                group_id=group_id,
                attempt=attempt,
                handler=handler.name,
            )
            if rows:
                if handler.rate_limits:
                    _wait_for_turn(app, handler, rows)
                crash_point(BEFORE_HANDLER)
                handed_over = True
                _call(handler, batch)
                crash_point(AFTER_HANDLER)
        except LeaseLost:
            result = lease_lost(handler, job)
        except RetryAfter as retry_after:
            keys = _limited_keys(handler, rows)
            finish = functools.partial(finish_deferred, app, handler, job, retry_after, keys)
            result = _recorded(app, handler, job, finish)
        except Throttled as throttled:
            result = finish_throttled(app, handler, job, throttled.seconds)
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
            bisecting = handler.bisect and handed_over and len(rows) > 1 and not give_up
            apart, behind = _bisected(handler, rows) if bisecting else ([], [])
            cause = failure_cause(error, handler, job) if handed_over else None
            result = _recorded(
                app,
                handler,
                job,
                lambda: finish_failed(
                    app, handler, job, text, give_up=give_up, split_off=apart, unclaim=behind
                ),
            )
            result = replace(result, cause=cause) if result.outcome in (RETRYING, DEAD) else result
        else:
            result = _recorded(
                app,
                handler,
                job,
                lambda: _finish_returned(app, handler, job, batch, then, superseded),
            )
    result = replace(
        result,
        size=len(rows) + len(superseded) + expired,
        expired=expired,
        duration=time.monotonic() - started,
        created_at=tuple(column_values(rows, "created_at")),
        finished_at=database_clock(app.engine).now(),
        promise=handler.urgency.promise,
    )
    _log_result(result)
    return result


def _finish_returned(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    batch: Batch[Any],
    then: NextClaim | None = None,
    superseded: Sequence[int] = (),
) -> BatchResult:
    """Record what a handler that returned did: its events succeeded but those it retried,
    deferred or discarded; the events its batch left out as ``superseded`` are archived so."""
    try:
        return finish_succeeded(app, handler, job, batch, then, superseded)
    except FinishRefused as refused:
        if not is_missing_table(refused.error):
            # The handler succeeded but the database will not record it: the group is held,
            # never handed over again by itself (its events were delivered).
            return hold_refused(app, handler, job, SUCCEEDED, refused)
        # Its table went away under it: the failed way, as for any attempt whose table is
        # missing (see Worker).
        give_up = handler.retry.exhausted(job.attempts)
        return finish_failed(app, handler, job, str(refused), give_up=give_up)


def _recorded(
    app: Outbox, handler: Handler[Any], job: queries.JobRow, finish: Callable[[], BatchResult]
) -> BatchResult:
    """Run ``finish``, the completion of an attempt the handler made. Should outbox's own
    bookkeeping fail there (not the database: that is retried, or held as refused, by the
    completion), the attempt's outcome is not known to the database; the group must then not
    be handed to the handler again by itself (it may have delivered: run again, it would
    deliver twice), nor pass for a lease expiry. It is held as refused, with the error and its
    traceback on the job, where ``outbox refused list``, ``status`` and ``check`` show it."""
    try:
        return finish()
    except (DBAPIError, FinishRefused, LeaseLost):
        raise
    except Exception as error:
        text = format_error(error)
        log.error(
            _log.COMPLETION_FAILED,
            handler=handler.name,
            group_id=str(job.group_id),
            error=text.splitlines()[0][:500],
        )
        return hold_group(
            app, handler, job, f"outbox could not record what the handler did: {text}"
        )


class Throttled(Exception):  # noqa: N818 - an outcome, as LeaseLost is
    """The handler's rate limit has no turn for the group within the wait a worker allows."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no turn for {seconds:.3f} s")
        self.seconds = seconds


def _wait_for_turn(app: Outbox, handler: Handler[Any], rows: Sequence[Any]) -> None:
    """Reserve the group's call under the handler's rate limits (each of its keys' limits, for
    per-key ones) and wait for its turn; raise :class:`Throttled` when the turn is further
    off than a worker waits."""
    keys = {column: _keys(handler, rows, column) for column in _limiter.key_columns(handler)}
    throttled = _limiter.take_turn(app, handler, len(rows), keys)
    if throttled is not None:
        raise Throttled(throttled)


def _bisected(handler: Handler[Any], rows: Sequence[Any]) -> tuple[list[int], list[int]]:
    """Bisection: the ids of the later half of a failing group, as two lists: those that go on
    in a group of their own, and those that go back to the buffer. An ordered handler keeps one
    group of a key at a time, so the later events of a key the earlier half holds go back,
    behind it; the other keys' later events may form a group of their own."""
    earlier, later = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    ids = column_values(later, "id")
    if handler.ordering_key is None:
        return ids, []
    kept = set(_keys(handler, earlier, handler.ordering_key)) - {None}
    keys = _keys(handler, later, handler.ordering_key)
    behind = {i for i, key in zip(ids, keys, strict=True) if key in kept}
    return [i for i in ids if i not in behind], [i for i in ids if i in behind]


def _limited_keys(handler: Handler[Any], rows: Sequence[Any]) -> list[tuple[str, str | None]]:
    """The group's events' keys under per-key rate limits, as ``(column, value)``; none
    without."""
    columns = _limiter.key_columns(handler)
    return [(column, key) for column in columns for key in _keys(handler, rows, column)]


def _keys(handler: Handler[Any], rows: Sequence[Any], key: str) -> list[str | None]:
    """A key column of rows of the handler's table, as text (a JSON or pickled value is not
    hashable): read by position, since a row names a column by its name in the table, which
    may differ from the key the table and the handler know it by."""
    position = list(handler.table.c.keys()).index(key)
    return [None if row[position] is None else str(row[position]) for row in rows]


def _coalesced(handler: Handler[Any], rows: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """The rows a coalescing handler is handed, in id order: the latest of each key and every
    row without one; and the ids of the rows those supersede. Read by position, as in
    :func:`_keys`."""
    columns = list(handler.table.c.keys())
    assert handler.ordering_key is not None
    key, ident = columns.index(handler.ordering_key), columns.index("id")
    # As text, as _keys reads them: a key column's value need not be hashable (a pickled one).
    keys = [None if row[key] is None else str(row[key]) for row in rows]
    latest = {k: index for index, k in enumerate(keys) if k is not None}
    handed: list[Any] = []
    superseded: list[int] = []
    for index, (row, k) in enumerate(zip(rows, keys, strict=True)):
        if k is None or latest[k] == index:
            handed.append(row)
        else:
            superseded.append(row[ident])
    return handed, superseded


def _interrupted(job: queries.JobRow) -> bool:
    """Did the previous attempt stop without an outcome (worker lost, handler timed out)?"""
    last = job.last_error or ""
    return job.attempts > 1 and (
        last.startswith(queries.RESCUED_ERROR) or last.startswith(HandlerTimeoutError.__name__)
    )


def _expire(app: Outbox, handler: Handler[Any], job: queries.JobRow) -> int:
    """Archive the group's events older than ``expires_after`` as ``expired``; fenced."""
    assert job.group_id is not None
    assert handler.expires_after is not None
    group_id, older_than = job.group_id, handler.expires_after

    def work(conn: Connection) -> int:
        if not queries.extend_lease(conn, job.id, job.lease_token, app.settings.lease_seconds):
            raise LeaseLost
        reason = f"expired: older than {older_than:g} s when its group was handled"
        return archive_events(
            conn, app, handler, group_id, ArchiveStatus.EXPIRED, job.attempts, reason, None,
            older_than=older_than,
        )  # fmt: skip

    return run_in_transaction(app.engine, work, patience=app.settings.lease_seconds)


def _call(handler: Handler[Any], batch: Batch[Any]) -> None:
    """Call the handler, sync or async, within its timeout (see :mod:`outbox._engine.invoke`)."""
    _invoke.call(handler, batch)


def _log_result(result: BatchResult) -> None:
    if result.outcome in (SUCCEEDED, LEASE_LOST) and not log.enabled(logging.INFO):
        return  # its fields (the oldest event's lateness among them) are not gathered for nothing
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
    if result.retry_after is not None:
        fields["retry_after"] = round(result.retry_after, 3)
    if result.cause is not None:
        fields["cause"] = result.cause
    if result.retried or result.deferred or result.discarded or result.dead or result.expired:
        fields.update(
            retried=result.retried,
            deferred=result.deferred,
            discarded=result.discarded,
            dead=result.dead,
            expired=result.expired,
        )
    if result.superseded:
        fields["superseded"] = result.superseded
    if result.outcome in (RETRYING, DEFERRED, DEAD, REFUSED) and result.error:
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
