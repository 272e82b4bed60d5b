"""Running one leased job, whoever runs it: the one place a job runs.

A :class:`Runner` takes a job its caller has leased (a worker's acquisition, ``lease_job`` for
an executor handed a job's id, ``outbox.testing.drain``) and runs it to its end: a batch job's
group goes to its handler and its outcome is written, fenced by the lease; a claim job claims
groups and hands each to its handler at once, while full batches wait. It returns what became
of the job as a value (:class:`JobRun`), and tells its caller what the caller may act on
through the callbacks it was built with (River's ``jobexecutor``, oban-py's ``_executor``):
when a group it put off is due again, a handler whose buffer table is gone, each result.

What the runner decides, the same for every caller:

- a paused handler's job is given back unattempted (its attempt uncounted), as if never leased;
- a buffer table that does not exist gives the job back and sets its handler aside (the
  attempt stays counted when the handler ran and only the dead-lettering write was refused);
- a result feeds the handler's circuit breaker, a downstream's Retry-After pauses the handler
  here at once, and the result is counted (stats, throughput);
- a claim job claims again while full batches wait, for up to ``CLAIM_LOOP_SECONDS``, through
  a gate of ``claims_in_flight`` claims per handler; a handler with a fleet-wide cap (its
  ``concurrency``, or one group while its breaker probes) handles a claimed group only once
  its groups in flight, that one among them, are counted within the cap, and otherwise leaves
  it to a capped acquisition.

The runner holds no thread and no loop: it runs in its caller's thread. A database error other
than a missing table goes up to the caller, the job still leased (its lease runs out and the
rescuer frees it, as when a worker dies).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._core import log as _log
from outbox._db import buffer_table_missing, queries, run_in_transaction
from outbox._engine import breaker as _breaker
from outbox._engine import claimer
from outbox._engine.acquisition import YOUNG_LEASE_SHARE
from outbox._engine.batch_job import run_batch_job
from outbox._engine.completion import FinishRefused, pauses_on_retry_after
from outbox._engine.flow_state import FlowState
from outbox._engine.stats import WorkerStats
from outbox.app import Outbox
from outbox.handler import Handler
from outbox.results import THROTTLED, BatchResult

log = _log.get_logger(__name__)

# How long one claim job may keep claiming and handling its handler's full batches in a row.
CLAIM_LOOP_SECONDS = 1.0
# Claims of one handler a runner makes at once, across the threads that share it. A claim steps
# over every row that concurrent claims hold locked (about 0.9 us each, `python -m
# benchmarks.claim_contention`): with fast handlers, all of a worker's threads would be
# claiming side by side, mostly paying for each other's locks. Two keep one claim going while
# the last one commits and its rows are read: with one, a process drained a quarter slower for a
# tenth less of PostgreSQL's CPU (`python -m benchmarks.compare_revisions`, 500,000 events).
# `outbox work --processes N` gives each process its share, and at least one. Slow handlers
# never meet this limit: their threads spend their time in the handler.
CLAIMS_IN_FLIGHT_PER_HANDLER = 2
# How often a runner's own view of the handlers' pauses and breakers is read again, when it
# builds that view itself.
FLOW_STATE_REFRESH_SECONDS = 1.0


class RunOutcome(StrEnum):
    """How a job's run ended."""

    RAN = "ran"
    """It ran to its end: its groups' results are in :attr:`JobRun.results` (none when a claim
    job found nothing to claim, or left its group to a capped acquisition)."""
    PAUSED = "paused"
    """Given back unattempted, its attempt uncounted: its handler is paused."""
    TABLE_MISSING = "table_missing"
    """Given back: its handler's buffer table does not exist (:attr:`JobRun.missing`), and the
    handler is set aside."""
    LEASE_TOO_OLD = "lease_too_old"
    """Given back unattempted: its lease may be lost by now (see ``Runner._lease_too_old``)."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """What became of one leased job."""

    job: queries.JobRow
    outcome: RunOutcome
    results: tuple[BatchResult, ...] = ()
    """The results of the groups handled, in order: the batch job's own group, or each group a
    claim job claimed and handled here."""
    claimed: int = 0
    """Groups a claim job claimed whose batch job came back leased here (and ran here)."""
    released: bool = False
    """A claim job given back with more rows waiting: its time was up or its runner stopping."""
    counted: bool = False
    """Given back with its attempt counted (:attr:`RunOutcome.TABLE_MISSING` only): the handler
    ran; only the write that would have dead-lettered the group was refused."""
    missing: Mapping[str, str] = field(default_factory=dict)
    """Buffer tables found missing while it ran: handler -> table."""
    returned: tuple[int, ...] = ()
    """Batch jobs given back unattempted because their leases may be lost by now
    (:attr:`RunOutcome.LEASE_TOO_OLD`): due at once, for whoever is next."""


class ResultCounter(Protocol):
    """What counts results as they are written (a worker's throughput counts)."""

    def note(self, result: BatchResult) -> None:
        """Count one result."""


def _not_stopping() -> bool:
    return False


class Runner:
    """Runs leased jobs of an application's handlers, one call per job, from any thread.

    ``worker_id``: whom the groups a claim job claims are leased to (a job's lease owner; see
    ``lease_job``). ``handlers``: the handlers whose jobs it runs (all the app's by default).
    ``flow``: what is known of the handlers' pauses and breakers, shared with the caller's
    acquisition (built and refreshed by the runner when not given). ``stats``: counted into
    as jobs run. ``claims_in_flight``: claims of one handler made at once across the threads
    that share this runner.

    Callbacks, each optional and called from the thread running the job: ``on_result`` with
    each result, once it is written and counted; ``throughput`` notes each result before the
    breaker counts it; ``note_due(seconds)`` when a group it put off (retried, deferred, given
    back by its rate limits) is due again; ``note_turn(seconds)`` when that group was given
    back by its rate limits; ``set_aside(missing)`` with the handlers whose buffer table does not
    exist (handler -> table); ``database_error(error)`` with a statement's failure the runner
    goes on after (the breaker's count: the outcome is written; without it, the failure goes
    up to the caller); ``hold(job_id)`` and
    ``let_go(job_id)`` around a claimed group's batch job, leased here while it runs (the
    leases a worker extends); ``stopping()``: whether its caller is stopping (a claim job then
    goes back to the job table rather than claiming again).
    """

    def __init__(
        self,
        app: Outbox,
        *,
        worker_id: str,
        handlers: Mapping[str, Handler[Any]] | None = None,
        flow: FlowState | None = None,
        stats: WorkerStats | None = None,
        claims_in_flight: int = CLAIMS_IN_FLIGHT_PER_HANDLER,
        on_result: Callable[[BatchResult], None] | None = None,
        throughput: ResultCounter | None = None,
        note_due: Callable[[float], None] | None = None,
        note_turn: Callable[[float], None] | None = None,
        set_aside: Callable[[Mapping[str, str]], None] | None = None,
        database_error: Callable[[DBAPIError], None] | None = None,
        hold: Callable[[int], None] | None = None,
        let_go: Callable[[int], None] | None = None,
        stopping: Callable[[], bool] = _not_stopping,
        heard: Callable[[], bool] | None = None,
    ) -> None:
        if claims_in_flight < 1:
            raise ValueError(f"claims_in_flight must be >= 1, got {claims_in_flight}")
        self.app = app
        self.worker_id = worker_id
        self.handlers: Mapping[str, Handler[Any]] = (
            dict(app.handlers) if handlers is None else dict(handlers)
        )
        self.flow = (
            FlowState(app, refresh_every=FLOW_STATE_REFRESH_SECONDS) if flow is None else flow
        )
        self._own_flow = flow is None
        self.stats = WorkerStats() if stats is None else stats
        self.claims_in_flight = claims_in_flight
        self._claim_gates = {
            name: threading.BoundedSemaphore(claims_in_flight) for name in self.handlers
        }
        self._capped = {
            h.name: h.concurrency for h in self.handlers.values() if h.concurrency is not None
        }
        self._on_result = on_result
        self._throughput = throughput
        self._note_due = note_due
        self._note_turn = note_turn
        self._set_aside = set_aside
        self._database_error = database_error
        self._hold = hold
        self._let_go = let_go
        self._stopping = stopping
        self._heard = heard

    # --- what callers ask ------------------------------------------------------------------

    def cap(self, name: str) -> int | None:
        """The most groups of a handler in flight fleet-wide: its ``concurrency``, or one while
        its circuit breaker probes; None when uncapped."""
        if self.flow.probing(name):
            return 1
        return self._capped.get(name)

    # --- running a job ---------------------------------------------------------------------

    def run(self, job: queries.JobRow, leased_at: float | None = None) -> JobRun:
        """Run a job leased to this runner's caller to its end; what became of it.

        ``leased_at``: ``time.monotonic()`` when its lease was asked for (an executor's
        :func:`lease_job`): a batch job whose lease came back after half its length is given
        back unattempted, as a worker's acquisition does. A database error other than a
        missing buffer table goes up, the job still leased.
        """
        if self._own_flow:
            self.flow.refresh_if_due()
        handler = self.handlers[job.handler]
        if job.kind == schema.JobKind.CLAIM:
            return self._run_claim_job(handler, job)
        if self._lease_too_old(job, leased_at):
            return JobRun(job, RunOutcome.LEASE_TOO_OLD, returned=(job.id,))
        return self.run_batch_job(handler, job)

    def run_batch_job(
        self,
        handler: Handler[Any],
        job: queries.JobRow,
        preloaded: Sequence[Any] | None = None,
        then: claimer.NextClaim | None = None,
    ) -> JobRun:
        """Hand a leased batch job's group to its handler and write its outcome.

        ``preloaded``: the group's rows, when its claim returned them. ``then``: the claim to
        make with the group's finish, if it succeeded (see ``completion.finish_succeeded``).
        """
        if self.flow.paused(handler.name):
            # Leased before the pause began, or claimed since: not attempted while it lasts.
            self.give_back(job, counted=False)
            return JobRun(job, RunOutcome.PAUSED)
        try:
            result = run_batch_job(self.app, handler, job, preloaded=preloaded, then=then)
        except FinishRefused as refused:
            # Refused while dead-lettering the group: its attempts are spent, and stay counted;
            # it is dead-lettered once its table is back.
            missing = self.table_missing(handler, refused.error)
            if missing is None:
                raise
            self.give_back(job, counted=True)
            return JobRun(job, RunOutcome.TABLE_MISSING, counted=True, missing=missing)
        except DBAPIError as error:
            # Raised before the handler was called: no attempt was made.
            missing = self.table_missing(handler, error)
            if missing is None:
                raise
            self.give_back(job, counted=False)
            return JobRun(job, RunOutcome.TABLE_MISSING, missing=missing)
        self.record(result)
        return JobRun(job, RunOutcome.RAN, results=(result,))

    def _run_claim_job(self, handler: Handler[Any], job: queries.JobRow) -> JobRun:
        """Claim, handle, and claim again while full batches wait, for up to a second.

        The claimed group's batch job comes back leased to this runner's worker with its rows,
        and is handled here at once: no second trip through the job table. While full batches
        keep coming, the claim job stays leased and runs again; after ``CLAIM_LOOP_SECONDS`` it
        goes back through acquisition, so a long backlog cannot keep its thread from more urgent
        work. A capped handler's group is handled here only while its cap has room (see
        :meth:`_within_cap`); otherwise it waits for a capped acquisition, and so does the rest.

        While the claim job is kept, the next claim is made in the transaction that finishes
        the group before it (:class:`claimer.NextClaim`), but for a capped handler's.
        """
        deadline = time.monotonic() + CLAIM_LOOP_SECONDS
        results: list[BatchResult] = []
        missing: dict[str, str] = {}
        claimed = 0
        chains = self.cap(handler.name) is None and claimer.chains(handler)
        gate = self._claim_gates[handler.name]

        def ended(
            outcome: RunOutcome, *, released: bool = False, returned: tuple[int, ...] = ()
        ) -> JobRun:
            return JobRun(
                job,
                outcome,
                results=tuple(results),
                claimed=claimed,
                released=released,
                missing=missing,
                returned=returned,
            )

        claim: claimer.Claim | None = None
        chained = False  # ``claim`` was made with the previous group's finish
        while True:
            if not chained:
                if self.flow.paused(handler.name):
                    self.give_back(job, counted=False)
                    return ended(RunOutcome.PAUSED)
                with gate:
                    try:
                        claim = claimer.run_claim_job(
                            self.app, handler, job, lease_to=self.worker_id, keep=True
                        )
                    except DBAPIError as error:
                        found = self.table_missing(handler, error)
                        if found is None:
                            raise
                        missing.update(found)
                        self.give_back(job, counted=False)
                        return ended(RunOutcome.TABLE_MISSING)
            if claim is not None and not self._within_cap(handler, claim):
                # The cap is full: the group waits for a capped acquisition, and so do the
                # groups after it (the claim job goes back rather than claim them one by one).
                if claim.more:
                    claimer.release_claim_job(self.app, job)
                return ended(RunOutcome.RAN, released=claim.more)
            more = claim is not None and claim.more
            due = not self._stopping() and time.monotonic() < deadline
            # The next claim rides with this group's finish when this thread would claim
            # again at once anyway.
            following = None
            if chains and more and due:
                following = claimer.NextClaim(self.app, handler, job, self.worker_id, gate)
            batch = self.handle_claim(claim, then=following)
            if batch is None and claim is not None and claim.job is not None:
                # Given back, its lease perhaps lost (_lease_too_old): so perhaps is the claim
                # job's, and this worker claims no more for now.
                if claim.more:
                    claimer.release_claim_job(self.app, job)
                return ended(RunOutcome.RAN, released=claim.more, returned=(claim.job.id,))
            if batch is not None:
                claimed += 1
                results.extend(batch.results)
                missing.update(batch.missing)
            if claim is None or not more:
                return ended(RunOutcome.RAN)
            chained = following is not None and following.made
            if chained:
                assert following is not None
                claim = following.claim
                if claim is None:
                    # Nothing claimed: the claim job was deleted or released, or lost.
                    return ended(RunOutcome.RAN)
                if self._stopping() and claim.job is not None:
                    # Stopped while the group before was handled: the group claimed with its
                    # finish goes back unattempted, as does the claim job.
                    self.give_back(claim.job, counted=False)
                    if claim.more:
                        claimer.release_claim_job(self.app, job)
                    return ended(RunOutcome.RAN, released=claim.more)
                continue
            if not due or self._stopping() or time.monotonic() >= deadline:
                # Still held, more rows waiting: back to the job table for whoever is next.
                claimer.release_claim_job(self.app, job)
                return ended(RunOutcome.RAN, released=True)

    def _within_cap(self, handler: Handler[Any], claim: claimer.Claim) -> bool:
        """Whether a group a claim leased here may be handled under its handler's fleet-wide
        cap (:meth:`cap`); given back unattempted, to wait for a capped acquisition, if not.

        The claim leased it (its rows came with it, and the claim job stays held), and then the
        handler's groups in flight are counted as a capped acquisition counts them, its own
        among them: one short transaction, where the claim used to lease nothing and its group
        went through the job table, a capped acquisition and a second read of its rows. A
        worker killed in between loses nothing: the lease runs out and the group is rescued.
        """
        cap = self.cap(handler.name)
        if cap is None or claim.job is None:
            return True
        leased = claim.job
        room = run_in_transaction(
            self.app.engine,
            lambda conn: queries.within_cap(conn, self.app.dialect, handler.name, cap),
        )
        if not room:
            self.give_back(leased, counted=False)
        return room

    def handle_claim(
        self, claim: claimer.Claim | None, then: claimer.NextClaim | None = None
    ) -> JobRun | None:
        """Run the batch job a claim leased here (with the rows it returned); None when the
        claim found nothing or left its group's batch job to acquisition. ``then``: the next
        claim, to make with this group's finish (see :meth:`run_batch_job`)."""
        if claim is None or claim.job is None or self._lease_too_old(claim.job, claim.started):
            return None
        self.stats.record_claim()
        handler = self.handlers[claim.handler]
        if self._hold is not None:
            self._hold(claim.job.id)
        try:
            return self.run_batch_job(handler, claim.job, preloaded=claim.rows, then=then)
        finally:
            if self._let_go is not None:
                self._let_go(claim.job.id)

    def _lease_too_old(self, job: queries.JobRow, started: float | None) -> bool:
        """Whether the lease of a batch job about to be handled may be lost already, so that
        its handler must not be called: the claim or lease that leased it, asked for at
        ``started`` (``time.monotonic()``), took half the lease or more to come back (a commit
        acknowledged late, a stalled process), or the fleet has not heard this worker for long
        enough to rescue what it holds any moment now (``heard``). Its group then goes back
        unattempted, by a write fenced by the lease: another holder's is left alone."""
        age = 0.0 if started is None else time.monotonic() - started
        heard = self._heard is None or self._heard()
        if heard and age < self.app.settings.lease_seconds * YOUNG_LEASE_SHARE:
            return False
        log.warning(
            _log.LEASE_TOO_OLD,
            handler=job.handler,
            group_id=str(job.group_id),
            claim_seconds=None if started is None else round(age, 3),
            lease_seconds=self.app.settings.lease_seconds,
            heard_recently=heard,
        )
        self.give_back(job, counted=False)
        return True

    # --- what a result sets going ------------------------------------------------------------

    def record(self, result: BatchResult) -> None:
        """What follows a written result: when its group is due again, the pause a Retry-After
        asks for, the counts, the handler's circuit breaker, and ``on_result``."""
        handler = self.handlers[result.handler]
        if result.due_in is not None:
            if self._note_due is not None:
                self._note_due(result.due_in)
            if result.outcome == THROTTLED and self._note_turn is not None:
                self._note_turn(result.due_in)
        if result.retry_after is not None and pauses_on_retry_after(handler):
            self.flow.note(result.handler, result.retry_after)
        self.stats.record(result)
        if self._throughput is not None:
            self._throughput.note(result)
        if handler.circuit_breaker is not None:
            try:
                if _breaker.record(self.app, handler, handler.circuit_breaker, result, self.flow):
                    self.flow.refresh()  # it opened or closed: known here at once
            except DBAPIError as error:
                # The outcome is written; only the breaker's count missed it.
                if self._database_error is None:
                    raise
                self._database_error(error)
        if self._on_result is not None:
            self._on_result(result)

    # --- giving a job back -------------------------------------------------------------------

    def table_missing(self, handler: Handler[Any], error: DBAPIError) -> dict[str, str] | None:
        """Did ``error`` come from the handler's buffer table not existing? If so, the handlers
        set aside for it (handler -> table), told to ``set_aside``; None otherwise."""
        found = buffer_table_missing(self.app.engine, error, {handler.name: handler.tables})
        if found is None:
            return None
        missing = dict(found.missing)
        if self._set_aside is not None:
            self._set_aside(missing)
        return missing

    def give_back(self, job: queries.JobRow, *, counted: bool) -> bool:
        """Give back a job that could not run here: its buffer table is missing, or its handler
        is paused. False when its lease was lost meanwhile.

        ``counted``: the attempt was made (the handler ran), and stays counted.
        """

        def work(conn: Any) -> bool:
            if counted:
                return queries.release_job(
                    conn, job.id, job.lease_token, delay_seconds=0, error=job.last_error
                )
            return queries.return_job(conn, job.id, job.lease_token)

        return run_in_transaction(self.app.engine, work)


def new_worker_id() -> str:
    """A worker id no other holds: host, process, and eight random hex digits. It names the
    holder of the jobs leased with it (``outbox status``, the rescuer's logs)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_job(
    app: Outbox,
    job_id: int,
    worker_id: str,
    lease_seconds: float | None = None,
    *,
    handlers: Collection[str] | None = None,
) -> queries.JobRow | None:
    """Lease one job by its id to ``worker_id``, when it is due, unleased, and of a handler of
    ``handlers`` (the app's registered handlers by default) not paused; None otherwise (leased
    by another, finished and gone, not due yet, paused, or a handler not served here).

    For an executor handed a job's id (a message a broker may deliver twice): the job table
    decides who runs it, so a second delivery finds it leased or gone and does nothing. A
    batch job of a handler with a fleet-wide ``concurrency`` cap is leased only while the cap
    has room. ``lease_seconds``: the app's ``lease_seconds`` by default.
    """
    seconds = app.settings.lease_seconds if lease_seconds is None else lease_seconds
    if not 0 < seconds < float("inf"):
        raise ValueError(f"lease_seconds must be > 0 and finite, got {lease_seconds!r}")
    served = list(app.handlers) if handlers is None else list(handlers)
    caps = {h.name: h.concurrency for h in app.select_handlers(served) if h.concurrency is not None}
    return run_in_transaction(
        app.engine,
        lambda conn: queries.lease_job(
            conn,
            app.dialect,
            job_id=job_id,
            worker_id=worker_id,
            token=uuid.uuid4(),
            lease_seconds=seconds,
            handlers=served,
            caps=caps,
        ),
    )
