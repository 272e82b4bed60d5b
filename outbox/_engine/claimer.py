"""The claimer: stamps a fresh group id on up to ``batch_size`` unclaimed rows.

A claim and the batch job of the group it creates are written in one transaction, so a group
never exists without the job that will handle it. Finding nothing is a normal, cheap outcome.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import ColumnElement, Connection

from outbox import schema
from outbox._core import log as _log
from outbox._core.faults import AFTER_CLAIM, crash_point
from outbox._db import dialects, queries, run_in_transaction
from outbox.app import Outbox
from outbox.handler import Handler

log = _log.get_logger(__name__)


# What a driver raises while turning a stored value into Python (the statement itself worked),
# and what a claim's rows raise when a column's type cannot load one of their values.
UNREADABLE_ROW_ERRORS = (
    RecursionError,
    UnicodeDecodeError,
    ValueError,
    OverflowError,
    queries.UnreadableRowsError,
)


class LeaseLost(Exception):  # noqa: N818 - an outcome, not an error the user sees
    """Raised inside a transaction to roll it back when the job's lease is no longer ours."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A group just claimed."""

    handler: str
    group_id: uuid.UUID
    size: int
    rows: Sequence[Any] | None = field(default=None, repr=False)
    """The claimed rows (all the table's columns), ordered by id, when asked for and readable."""
    job: queries.JobRow | None = None
    """The group's batch job, when the claim leased it to the claiming worker."""
    more: bool = False
    """The claim job is still held and more rows wait: run it again (see ``keep``)."""
    started: float | None = None
    """Monotonic seconds when the claim's statements began: its lease, stamped by the database
    as they ran, is no older than this."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who takes a claimed group's batch job at once: a worker, with a lease token."""

    worker_id: str
    token: uuid.UUID
    seconds: float


def _claim(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    lease: Lease | None = None,
    held: queries.JobRow | None = None,
) -> Claim | None:
    """Claim a group and create its batch job; ``held``: the claim job this claim runs for.

    ``Claim.more`` says whether unclaimed rows remained past this full batch (the caller
    decides what to do with it). On PostgreSQL a leased claim is one round trip: it extends
    the lease of ``held`` as its fence, claims, inserts the batch job and probes for more.
    """
    started = time.monotonic()
    if handler.max_wait is not None and not _batch_due(conn, handler):
        return None
    group_id = uuid.uuid4()
    sized, keyed = handler.max_batch_bytes, handler.group_by is not None
    ordered = handler.ordering_key is not None
    plain = sized is None and not keyed and not ordered
    if lease is not None and app.supports.one_statement_claim and plain:
        return _claim_leased_in_one_statement(conn, app, handler, group_id, lease, held, started)
    in_order = claimable(handler)
    only = in_order
    if handler.claims_take_turns:
        # One claim of an ordered handler at a time, fleet-wide: two at once would each take
        # rows of the same key, the second past the first one's locked rows.
        queries.lock_handler_state(conn, app.dialect, handler.name)
    if keyed:
        key = _next_key(conn, app, handler, only)
        if key is None:
            return None
        only = queries.all_of(only, key)
    cut = False  # the group was closed by its size in bytes, not by its count
    rows: list[Any] | None = None
    table, limit = handler.table, handler.batch_size
    if sized is not None:
        size, cut = queries.claim_rows_sized(conn, app.dialect, table, group_id, limit, sized, only)
    elif lease is None:
        size = queries.claim_rows(conn, app.dialect, table, group_id, limit, only)
    else:
        rows, size = _claim_returning(conn, app, handler, group_id, only)
    if size and ordered and handler.flags is None and dialects.uses_skip_locked(app.dialect):
        given_back = queries.give_back_keys_past_skipped_rows(
            conn, table, str(handler.ordering_key), group_id
        )
        if given_back:
            key_name = str(handler.ordering_key)
            if rows is not None:
                rows = [r for r in rows if r is None or r._mapping[key_name] not in given_back]
            size = queries.count_group_rows(conn, table, group_id)
    if not size:
        return None
    job_id = queries.insert_batch_job(
        conn,
        handler=handler.name,
        group_id=group_id,
        priority=handler.urgency.priority,
        lease=None if lease is None else (lease.worker_id, lease.token, lease.seconds),
    )
    # Keyed groups are as large as their key's backlog: rows of other keys may wait.
    full = size == handler.batch_size or cut or keyed
    # More of any key: a keyed claim's condition names only the key it took.
    more = full and held is not None and queries.any_unclaimed(conn, table, in_order)
    job = None if lease is None else _leased_job(handler, group_id, job_id, lease)
    return Claim(handler.name, group_id, size, rows, job, more, started)


def _claim_leased_in_one_statement(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    group_id: uuid.UUID,
    lease: Lease,
    held: queries.JobRow | None,
    started: float,
) -> Claim | None:
    """The leased claim on PostgreSQL: rows, batch job and "more" from one statement.

    Rows the driver cannot read are handled as in :func:`_claim_returning`; the job the
    statement inserted is then looked up by its group.
    """
    table, limit = handler.table, handler.batch_size
    fence = None if held is None else (held.id, held.lease_token, app.settings.lease_seconds)
    rows: Sequence[Any] | None
    try:
        claimed = queries.claim_group_with_job(
            conn,
            table,
            group_id=group_id,
            limit=limit,
            held=fence,
            handler=handler.name,
            priority=handler.urgency.priority,
            lease=(lease.worker_id, lease.token, lease.seconds),
        )
    except UNREADABLE_ROW_ERRORS:
        rows, size = None, queries.count_group_rows(conn, table, group_id)
        job_id, more = queries.batch_job_of_group(conn, group_id), True
    else:
        rows, size, job_id, more = claimed.rows, len(claimed.rows), claimed.job_id, claimed.more
    if not size or job_id is None:
        return None
    job = _leased_job(handler, group_id, job_id, lease)
    return Claim(handler.name, group_id, size, rows, job, more and size == limit, started)


def _leased_job(
    handler: Handler[Any], group_id: uuid.UUID, job_id: int, lease: Lease
) -> queries.JobRow:
    """The batch job of a group just claimed, as the worker it is leased to holds it."""
    return queries.JobRow(
        id=job_id,
        kind=schema.JobKind.BATCH,
        handler=handler.name,
        slot=None,
        group_id=group_id,
        priority=handler.urgency.priority,
        attempts=1,
        lease_token=lease.token,
        last_error=None,
        lease_owner=lease.worker_id,
    )


def _claim_returning(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    group_id: uuid.UUID,
    only: ColumnElement[bool] | None = None,
) -> tuple[list[Any] | None, int]:
    """Claim and get the rows back from the claim's own UPDATE ... RETURNING where the
    database has it: the group is not selected a second time. Returns (rows, size).

    Rows the driver cannot read (JSON nested deeper than Python can parse, text that is not
    UTF-8) must not undo the claim, or the same oldest rows would block the buffer forever:
    the claim stands, rows come back as None, and loading them later fails that one group's
    attempt, which ends, after its attempts, in the archive.
    """
    table, limit = handler.table, handler.batch_size
    try:
        rows = queries.claim_rows_returning(conn, app.dialect, table, group_id, limit, only)
    except UNREADABLE_ROW_ERRORS:
        return None, queries.count_group_rows(conn, table, group_id)
    return rows, len(rows)


# Keyed groups: the key each process's claims of a handler took last. Claims take the keys
# with unclaimed rows in turn (in the key's order, the rows with no key after the highest), so
# that one key's backlog cannot hold up the others.
_last_keys: weakref.WeakKeyDictionary[Outbox, dict[str, Any]] = weakref.WeakKeyDictionary()
_last_keys_lock = threading.Lock()


def _next_key(
    conn: Connection, app: Outbox, handler: Handler[Any], only: ColumnElement[bool] | None
) -> ColumnElement[bool] | None:
    """The condition of the next key's rows, in turn, among the rows ``only`` allows (an
    ordered handler's in order); None when no row waits."""
    assert handler.group_by is not None
    with _last_keys_lock:
        last_keys = _last_keys.setdefault(app, {})
        last = last_keys.get(handler.name)
        turn = queries.next_key(conn, handler.table, handler.group_by, last, only)
        if turn is None:
            return None
        last_keys[handler.name], condition = turn
        return condition


def claimable(handler: Handler[Any]) -> ColumnElement[bool] | None:
    """Which unclaimed rows a claim of ``handler`` may take now: an ordered handler's rows in
    order (:func:`outbox._db.queries.in_order`); None: every one."""
    if handler.ordering_key is None:
        return None
    return queries.in_order(handler.table, handler.ordering_key, handler.name)


def _batch_due(conn: Connection, handler: Handler[Any]) -> bool:
    """A full batch waits, or a partial one is due."""
    waiting = queries.count_unclaimed(conn, handler.table, handler.batch_size, claimable(handler))
    full = waiting >= handler.batch_size
    return full or partial_batch_due(conn, handler)


def partial_batch_due(conn: Connection, handler: Handler[Any]) -> bool:
    """Size-or-time batches: is a batch smaller than ``batch_size`` worth claiming now?

    Always, without ``max_wait``; with it, once the oldest unclaimed event has waited that long.
    """
    if handler.max_wait is None:
        return True
    age = queries.oldest_unclaimed_age(conn, handler.table)
    return age is not None and age >= handler.max_wait


def release_claim_job(app: Outbox, job: queries.JobRow) -> bool:
    """Give a held claim job back, due at once; False when its lease was lost meanwhile."""
    return run_in_transaction(
        app.engine,
        lambda conn: queries.release_job(
            conn, job.id, job.lease_token, delay_seconds=0, error=None
        ),
        patience=app.settings.lease_seconds,
    )


def run_once(app: Outbox, handler: Handler[Any], *, lease_to: str | None = None) -> Claim | None:
    """Claim one group for ``handler`` and enqueue its batch job; None when nothing waits.

    ``lease_to``: a worker id; the batch job is created leased to it and returned with the
    claimed events (see :func:`run_claim_job`).
    """
    lease = None if lease_to is None else Lease(lease_to, uuid.uuid4(), app.settings.lease_seconds)
    claim = run_in_transaction(
        app.engine,
        lambda conn: _claim(conn, app, handler, lease),
        patience=app.settings.lease_seconds,
    )
    if claim is not None:
        crash_point(AFTER_CLAIM)
    return claim


def run_claim_job(
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    *,
    lease_to: str | None = None,
    keep: bool = False,
) -> Claim | None:
    """Run a claim job: claim a group, then finish the job, fenced by its lease.

    A claim that filled a whole batch while more rows wait keeps its slot and runs again at
    once; the distributor does not have to come round for each batch. With ``keep``, the
    claim job even stays leased to its worker (``Claim.more``), which runs it again without a
    round through the job table; otherwise it is released to be acquired again.
    ``lease_to``: a worker id; the group's batch job is then created leased to that worker
    (with the claim job's token) and returned with the claimed rows, for the worker to
    handle at once without another round through the job table.
    """
    lease = (
        None if lease_to is None else Lease(lease_to, job.lease_token, app.settings.lease_seconds)
    )
    try:
        claim = run_in_transaction(
            app.engine,
            lambda conn: _claim_step(conn, app, handler, job, lease, keep),
            patience=app.settings.lease_seconds,
        )
    except LeaseLost:
        log.warning(_log.LEASE_LOST, handler=handler.name, job_id=job.id, kind=job.kind)
        return None
    claimed(claim)
    return claim


def claimed(claim: Claim | None) -> None:
    """What follows a committed claim."""
    if claim is not None:
        crash_point(AFTER_CLAIM)
        log.debug(
            _log.GROUP_CLAIMED, handler=claim.handler, group_id=str(claim.group_id), size=claim.size
        )


def _claim_step(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    job: queries.JobRow,
    lease: Lease | None,
    keep: bool,
    fenced: bool = False,
) -> Claim | None:
    """One claim of a claim job and what it makes of the job (kept, released or deleted), in
    the caller's transaction; raises LeaseLost when the job is no longer ours. ``fenced``: the
    caller has pushed the job's lease back in this transaction already."""
    claim = _claim(conn, app, handler, lease, held=job)
    more = claim is not None and claim.more
    if more and keep:
        # A one-statement claim that found rows has extended the lease: its fence.
        fenced_by_claim = app.supports.one_statement_claim and lease is not None
        held = (
            fenced
            or fenced_by_claim
            or queries.extend_lease(conn, job.id, job.lease_token, app.settings.lease_seconds)
        )
    elif more:
        held = queries.release_job(conn, job.id, job.lease_token, delay_seconds=0, error=None)
    else:
        held = queries.delete_job(conn, job.id, job.lease_token)
        if held and (claim is None or claim.size < handler.batch_size):
            # The buffer is drained: the handler's other pending claim jobs would find
            # nothing either (a full batch says nothing about what is left, so not then).
            queries.delete_pending_claim_jobs(conn, handler.name)
    if not held:
        raise LeaseLost
    return None if claim is None else replace(claim, more=more and keep)


class NextClaim:
    """A kept claim job's next claim, made in the transaction that finishes the group it
    claimed before (see ``completion.finish_succeeded``): the finish and the next claim commit
    together, one transaction per group instead of two.

    A claim job whose lease was lost must then claim nothing and write nothing, so that the
    finish it rides with need not be rolled back for it (``lost`` says so instead): on
    PostgreSQL the claim's own statement is fenced by the lease; elsewhere the lease is pushed
    back first, and nothing is claimed when that finds the job no longer ours.
    """

    def __init__(
        self,
        app: Outbox,
        handler: Handler[Any],
        job: queries.JobRow,
        worker_id: str,
        gate: threading.Semaphore,
    ) -> None:
        self._app = app
        self._handler = handler
        self._job = job
        self._lease = Lease(worker_id, job.lease_token, app.settings.lease_seconds)
        self._gate = gate
        self.made = False
        """The claim was made, in a transaction that committed (the caller says so)."""
        self.claim: Claim | None = None
        self.lost = False

    @property
    def turn(self) -> threading.Semaphore:
        """The handler's bound on claims at once in this process, taken for the whole
        transaction the claim rides with, before it begins: waited for inside it, a thread
        would hold its finished job's row lock while it waits, and the heartbeat pushing that
        job's lease back would wait for it, holding the locks of other jobs whose holders hold
        the turn; no database sees a wait on a Python lock, and none breaks that cycle."""
        return self._gate

    def __call__(self, conn: Connection) -> None:
        """Claim in ``conn``'s transaction (with :attr:`turn` taken); run again if that
        transaction is."""
        self.claim, self.lost = None, False
        app, job = self._app, self._job
        fenced = not app.supports.one_statement_claim
        if fenced and not queries.extend_lease(
            conn, job.id, job.lease_token, app.settings.lease_seconds
        ):
            self.lost = True
            return
        try:
            self.claim = _claim_step(conn, app, self._handler, job, self._lease, True, fenced)
        except LeaseLost:
            self.lost = True

    def committed(self) -> None:
        """The transaction the claim was made in committed."""
        self.made = True
        if self.lost:
            log.warning(
                _log.LEASE_LOST,
                handler=self._handler.name,
                job_id=self._job.id,
                kind=self._job.kind,
            )
        claimed(self.claim)


def chains(handler: Handler[Any]) -> bool:
    """Whether a claim of ``handler``'s may ride with the finish of the group before it
    (:class:`NextClaim`): for a handler whose groups are plain (no size in bytes, no keys, no
    order, no wait for a full batch), claimed by the plain claim."""
    plain = handler.max_batch_bytes is None and handler.group_by is None
    return plain and handler.ordering_key is None and handler.max_wait is None
