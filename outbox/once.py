"""Run outbox's work once, from whatever schedules work already: cron, a Kubernetes CronJob, a
task in a web application's lifespan, a Flask command, a job system's periodic task.

Three steps, each a call of its own, and :func:`run_once` for all three:

- :func:`rescue_once` frees the jobs whose leases ran out (a run killed mid-way);
- :func:`distribute_once` enqueues the claim jobs the handlers need. With ``every`` (the
  caller's schedule, in seconds) it first takes the schedule's tick for each handler on the
  database: of any number of callers on the same tick (cron on three hosts, a task in each of
  a web application's processes), one distributes and the others learn that they lost;
- :func:`work_once` runs the jobs that are due, one at a time, until none is due now, its
  time budget is spent, or it has run ``max_groups`` groups.

Each returns a frozen result to branch on, which prints as JSON through
:func:`outbox.jsonable`. Every job runs through the same leases, fences, attempts,
pauses, limits and dead letters as under ``outbox work``; any number of callers may run at
once. While it works, a caller registers in ``outbox_workers`` (``outbox status`` lists it,
its id begins with ``once:``) and heartbeats, which keeps the leases of the jobs it runs; it
never leads the fleet, and it leaves no row behind when it ends.

What a caller gives up against ``outbox work``: events written between two runs wait for the
next one (no notification wakes a run); and a run killed mid-way leaves its jobs leased until
the lease ends (``Settings.lease_seconds``), when the next run's rescue frees them, unless an
``outbox work`` worker runs beside it, which judges a silent holder gone after
``Settings.worker_stale_after``. A run-once caller never judges another gone: its own
heartbeats have not been steady long enough to tell a dead holder from a database outage.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox import lifecycle, schema
from outbox._core import log as _log
from outbox._core.faults import AFTER_ACQUIRE, crash_point
from outbox._db import check_buffer_tables, generation, queries, run_in_transaction
from outbox._db.dialects import error_summary
from outbox._engine import acquisition, distributor
from outbox._engine.claimer import claimable
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner
from outbox._services.heartbeat import Heartbeat, heartbeat_interval
from outbox._services.rescuer import Rescuer
from outbox._services.throughput import Throughput
from outbox.app import Handler, Outbox
from outbox.exceptions import BufferTableMissingError
from outbox.ops import buffer_clock
from outbox.ops.scaling import Scaling, read_scaling
from outbox.results import BatchResult, Outcome

__all__ = [
    "DEFAULT_BUDGET_SECONDS",
    "MAX_BUDGET_SECONDS",
    "MAX_EVERY_SECONDS",
    "MIN_EVERY_SECONDS",
    "DistributionResult",
    "HandlerDistribution",
    "RescueResult",
    "RunResult",
    "Stopped",
    "WorkResult",
    "distribute_once",
    "rescue_once",
    "run_once",
    "work_once",
]

log = _log.get_logger(__name__)

DEFAULT_BUDGET_SECONDS = 50.0
"""How long :func:`work_once` starts new jobs for, unless told: a minute's cron run, with ten
seconds left for the job in flight to finish and the process to exit before the next."""
MAX_BUDGET_SECONDS = 86_400.0
"""The longest budget: a day. A longer one is a typo (milliseconds given as seconds)."""
MIN_EVERY_SECONDS = distributor.MIN_TICK_SECONDS
"""The shortest schedule ``every`` takes: ticks are named by their start in milliseconds."""
MAX_EVERY_SECONDS = distributor.MAX_TICK_SECONDS
"""The longest schedule ``every`` takes: a week."""
BACKLOG_COUNT_CAP = 100_000
"""Events counted per handler for a result's backlog, at most: a bounded read however deep
the backlog (a count equal to it means at least that many, see ``backlog_capped``)."""


_CLOCK_WARNED: set[int] = set()
"""The applications (by id) whose buffers' clocks this process has warned about."""
_CLOCK_WARNED_LOCK = threading.Lock()


class Stopped(StrEnum):
    """Why :func:`work_once` stopped starting jobs."""

    IDLE = "idle"
    """No job was due now."""
    BUDGET = "budget"
    """Its time budget was spent; jobs may still be due."""
    MAX_GROUPS = "max_groups"
    """It ran the most groups it was given; jobs may still be due."""
    STOPPED = "stopped"
    """Asked to stop: by its caller (``stop``: a SIGTERM, an application shutting down), or
    by an operator (``outbox workers drain|stop``, read at its heartbeat)."""


@dataclass(frozen=True, slots=True)
class HandlerDistribution:
    """What one distribution call did for one handler."""

    handler: str
    won: bool
    """This call distributed for the handler: it took the tick (or was given no ``every``).
    False: another caller had already taken this tick (or a later one), and distributed."""
    enqueued: int
    """Claim jobs this call enqueued (0 when it lost the tick)."""
    unclaimed: int | None
    """Unclaimed events counted, at most a few batches' worth; None when the tick was lost."""


@dataclass(frozen=True, slots=True)
class DistributionResult:
    """What :func:`distribute_once` did."""

    every: float | None
    """The schedule's interval in seconds; None: no tick, every call distributes."""
    tick: int | None
    """The tick taken or lost, named by its start in whole milliseconds since the Unix epoch
    by the database's clock; None without ``every``."""
    handlers: tuple[HandlerDistribution, ...]

    @property
    def won(self) -> list[str]:
        """The handlers this call distributed for."""
        return [h.handler for h in self.handlers if h.won]

    @property
    def lost(self) -> list[str]:
        """The handlers another caller had distributed for on this tick."""
        return [h.handler for h in self.handlers if not h.won]

    @property
    def enqueued(self) -> int:
        """Claim jobs this call enqueued, for every handler."""
        return sum(h.enqueued for h in self.handlers)

    def summary(self) -> str:
        """One line: what was distributed, and the tick lost."""
        text = f"distributed for {len(self.won)} handlers, {self.enqueued} claim jobs enqueued"
        if self.lost:
            text += f"; tick taken by another caller for {len(self.lost)}"
        return text


@dataclass(frozen=True, slots=True)
class RescueResult:
    """What :func:`rescue_once` did."""

    rescued: int
    """Jobs freed whose leases had run out: due again, their attempt counted."""

    def summary(self) -> str:
        """One line."""
        return f"{self.rescued} jobs rescued"


@dataclass(frozen=True, slots=True)
class WorkResult:
    """What :func:`work_once` did, and what it left. Seconds are float seconds; ages and due
    times are read from the database's clock."""

    stopped: Stopped
    seconds: float
    """How long it worked."""
    groups_succeeded: int
    groups_failed: int
    """Groups whose attempt failed and that will be tried again."""
    groups_deferred: int
    """Groups put off for the downstream's ``Retry-After`` (no attempt counted)."""
    groups_dead: int
    """Groups dead-lettered into the archive: an operator's to look at."""
    groups_throttled: int
    """Groups a rate limit gave back to wait for their turn (no attempt counted)."""
    groups_refused: int
    """Groups whose outcome the database refused to record: held (``outbox refused``)."""
    leases_lost: int
    """Jobs another worker had taken by the time this one finished them: nothing written."""
    events_succeeded: int
    backlog: int
    """Events left in the handlers' buffers, unclaimed or in groups (counted up to
    ``BACKLOG_COUNT_CAP`` per handler)."""
    backlog_capped: bool
    """A handler's count stopped at the cap: the backlog is at least ``backlog``."""
    oldest_age: float | None
    """Seconds since the oldest event left was written; None when the buffers are empty."""
    next_due_in: float | None
    """Seconds until work is due (0: now, when events wait for a distribution or a job is
    due); None when nothing waits. A paused handler's work does not count; a job another
    worker holds is that worker's."""

    @property
    def groups(self) -> int:
        """Groups this call ran, whatever became of them."""
        return (
            self.groups_succeeded
            + self.groups_failed
            + self.groups_deferred
            + self.groups_dead
            + self.groups_throttled
            + self.groups_refused
            + self.leases_lost
        )

    @property
    def needs_operator(self) -> bool:
        """Groups were dead-lettered or held as refused: someone should look."""
        return bool(self.groups_dead or self.groups_refused)

    def summary(self) -> str:
        """One line: the groups, why it stopped, and what is left."""
        text = (
            f"{self.groups_succeeded} groups succeeded, {self.groups_failed} failed, "
            f"{self.groups_deferred} deferred, {self.groups_dead} dead"
        )
        if self.groups_refused:
            text += f", {self.groups_refused} refused"
        text += f" ({self.stopped.value}, {self.seconds:.1f} s); "
        more = "+" if self.backlog_capped else ""
        text += f"{self.backlog}{more} events left"
        if self.oldest_age is not None:
            text += f", the oldest {self.oldest_age:.1f} s old"
        if self.next_due_in is not None:
            text += f", next due in {self.next_due_in:.1f} s"
        return text


@dataclass(frozen=True, slots=True)
class RunResult:
    """What :func:`run_once` did: its rescue, its distribution and its work; and what the
    fleet should be now (:func:`outbox.ops.scaling.read_scaling`), read after the work."""

    rescue: RescueResult
    distribution: DistributionResult
    work: WorkResult
    scaling: Scaling

    @property
    def desired_workers(self) -> int:
        """Worker slots that keep every band's promise with the backlog left (never 0 while a
        lease is live or runnable work waits): what an autoscaler, or a scheduler deciding
        whether to call again sooner or start more callers, follows."""
        return self.scaling.desired_workers

    @property
    def needs_operator(self) -> bool:
        """Groups were dead-lettered or held as refused in this run: someone should look."""
        return self.work.needs_operator

    @property
    def next_due_in(self) -> float | None:
        """Seconds until work is due (see :attr:`WorkResult.next_due_in`)."""
        return self.work.next_due_in

    def summary(self) -> str:
        """One line for a cron log."""
        return "; ".join((self.rescue.summary(), self.distribution.summary(), self.work.summary()))


# --- distribution -------------------------------------------------------------------------------


def distribute_once(
    app: Outbox,
    *,
    every: float | None = None,
    handlers: tuple[str, ...] | list[str] = (),
    patience: float = 0.0,
    at: dt.datetime | None = None,
) -> DistributionResult:
    """Enqueue the claim jobs every handler (or the named ones) needs, once.

    ``every``: the caller's schedule in seconds (a cron run each minute: 60). The call then
    takes the schedule's current tick (``floor(database now / every)``) for each handler, in
    a short transaction of its own, and distributes only for the handlers whose tick it won:
    of any number of callers on one tick, one distributes. None: no tick; every call
    distributes (overlapping calls are safe, only wasted). ``patience``: seconds to keep
    retrying through a database outage. A buffer table that does not exist raises
    BufferTableMissingError.

    ``at`` (with ``every``): the moment the caller's schedule meant, by the scheduler's clock
    (a Celery beat's send time, a CronJob's scheduled time): the tick it falls in is taken,
    rather than the one the database's clock is in when the call runs, so that a call that
    waited in a queue past its tick's end still takes its own tick. A moment more than
    :data:`SKEW_TICKS` ticks before the database's tick, or more than one tick after it (a
    scheduler's clock that is wrong, a call that waited too long), is not trusted: the
    database's tick is taken then.
    """
    if at is not None and (not isinstance(at, dt.datetime) or at.tzinfo is None):
        raise ValueError(f"at must be a datetime with a time zone, got {at!r}")
    selected = [h.name for h in app.select_handlers(handlers)]
    if every is None:
        done = distributor.run_once(app, selected, patience=patience)
        return DistributionResult(
            None,
            None,
            tuple(HandlerDistribution(d.handler, True, d.enqueued, d.unclaimed) for d in done),
        )
    every = distributor.check_tick_seconds(every)
    tick = distributor.database_tick(app, every)
    if at is not None:
        tick = _named_tick(distributor.tick_of(at, every), tick, every)
    taken = distributor.run_on_tick(app, tick, selected, patience=patience)
    found = tuple(
        HandlerDistribution(
            t.handler,
            t.won,
            0 if t.distribution is None else t.distribution.enqueued,
            None if t.distribution is None else t.distribution.unclaimed,
        )
        for t in taken
    )
    result = DistributionResult(every, tick, found)
    if result.lost:
        log.debug(_log.DISTRIBUTE_TICK_LOST, tick=tick, every=every, handlers=result.lost)
    return result


SKEW_TICKS = 2
"""How many ticks before the database's a scheduler's named tick may be and still be taken
(``distribute_once``'s ``at``): a message that waited in a queue this long still takes its own
tick, when no later one was taken."""


def _named_tick(named: int, database: int, every: float) -> int:
    """The tick a caller that named ``named`` takes, the database's clock being in
    ``database``: the named one, within ``SKEW_TICKS`` ticks before it to one tick after."""
    every_ms = round(every * 1000)
    if database - SKEW_TICKS * every_ms <= named <= database + every_ms:
        return named
    log.info(_log.DISTRIBUTE_TICK_SKEWED, named=named, database=database, every=every)
    return database


# --- rescue -------------------------------------------------------------------------------------


def rescue_once(app: Outbox) -> RescueResult:
    """Free the jobs whose leases ran out, so that they are due again (their attempt stays
    counted), and forget the rows of run-once callers killed before they could delete them,
    once silent for longer than a lease and the stale age. It never takes a silent worker for
    gone before its leases end: that is for a worker whose own heartbeats have been steady
    (``outbox work``)."""
    rescued = Rescuer(app, _caller_id()).run_once()
    silent = app.settings.lease_seconds + app.settings.worker_stale_after
    run_in_transaction(
        app.engine, lambda conn: queries.delete_silent_run_once_callers(conn, silent)
    )
    return RescueResult(rescued)


# --- work ---------------------------------------------------------------------------------------


def work_once(
    app: Outbox,
    *,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    max_groups: int | None = None,
    handlers: tuple[str, ...] | list[str] = (),
    stop: threading.Event | None = None,
) -> WorkResult:
    """Run the jobs that are due now, one at a time, in this thread; return what it did and
    what is left.

    It stops starting jobs once none is due, once ``budget_seconds`` have passed, once it ran
    ``max_groups`` groups (None: no such bound), or once ``stop`` is set (a SIGTERM, an
    application shutting down). The group in flight then finishes, so a call may take a
    group's time longer than its budget; a claim job claims no further group, and goes back
    to the job table for the next caller. Every job runs through the runner a worker runs it
    through (``outbox._engine.runner``). Handler objects are started before
    the first job and stopped after the last (:mod:`outbox.lifecycle`). Events written while
    it runs wait for the next distribution. Raises BufferTableMissingError, before doing
    anything, when a buffer table of its handlers does not exist.
    """
    if isinstance(budget_seconds, bool) or not 0 < budget_seconds <= MAX_BUDGET_SECONDS:
        raise ValueError(
            f"budget_seconds must be > 0 and at most {MAX_BUDGET_SECONDS:g} seconds, "
            f"got {budget_seconds!r}"
        )
    if max_groups is not None and (
        isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 1
    ):
        raise ValueError(
            f"max_groups must be a whole number >= 1 (None: no bound), got {max_groups!r}"
        )
    selected = app.select_handlers(handlers)
    check_buffer_tables(app.engine, {h.name: h.table for h in selected})
    generation.check(app.engine)
    with _CLOCK_WARNED_LOCK:
        # Once per application and process: a web application's task calls every few seconds.
        warn = id(app) not in _CLOCK_WARNED
        _CLOCK_WARNED.add(id(app))
    buffer_clock.enforce(app, [h.table for h in selected], warn=warn)
    counts = _Counts()
    started = time.monotonic()
    with _started(app, selected), _registered(app) as caller:
        stopped = caller.run(
            selected,
            counts.record,
            deadline=started + budget_seconds,
            max_groups=max_groups,
            done=counts.groups,
            stop=stop or threading.Event(),
        )
    seconds = time.monotonic() - started
    left = _left(app, selected)
    return WorkResult(
        stopped=stopped,
        seconds=seconds,
        groups_succeeded=counts.by_outcome[Outcome.SUCCEEDED],
        groups_failed=counts.by_outcome[Outcome.RETRYING],
        groups_deferred=counts.by_outcome[Outcome.DEFERRED],
        groups_dead=counts.by_outcome[Outcome.DEAD],
        groups_throttled=counts.by_outcome[Outcome.THROTTLED],
        groups_refused=counts.by_outcome[Outcome.REFUSED],
        leases_lost=counts.by_outcome[Outcome.LEASE_LOST],
        events_succeeded=counts.events_succeeded,
        backlog=left.backlog,
        backlog_capped=left.capped,
        oldest_age=left.oldest_age,
        next_due_in=left.next_due_in,
    )


# --- all three ----------------------------------------------------------------------------------


def run_once(
    app: Outbox,
    *,
    every: float | None = None,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    max_groups: int | None = None,
    handlers: tuple[str, ...] | list[str] = (),
    stop: threading.Event | None = None,
) -> RunResult:
    """Rescue, distribute, and run what is due, once: what a cron line or a scheduler's task
    calls (see :func:`rescue_once`, :func:`distribute_once`, :func:`work_once` for each
    argument).

    The rescue comes first, so that the jobs a run killed mid-way left behind, once their
    leases ended, are handled in this run rather than the next.
    """
    rescued = rescue_once(app)
    distributed = distribute_once(app, every=every, handlers=handlers)
    worked = work_once(
        app, budget_seconds=budget_seconds, max_groups=max_groups, handlers=handlers, stop=stop
    )
    result = RunResult(rescued, distributed, worked, read_scaling(app, handlers))
    log.info(
        _log.RUN_ONCE_DONE,
        rescued=rescued.rescued,
        enqueued=distributed.enqueued,
        tick_lost=len(distributed.lost),
        stopped=worked.stopped.value,
        groups_succeeded=worked.groups_succeeded,
        groups_failed=worked.groups_failed,
        groups_dead=worked.groups_dead,
        backlog=worked.backlog,
        next_due_in=worked.next_due_in,
        desired_workers=result.desired_workers,
    )
    return result


# --- the parts ----------------------------------------------------------------------------------


def _caller_id() -> str:
    """A run-once caller's id: like a worker's, with the prefix that keeps it from leading."""
    return f"{queries.RUN_ONCE_PREFIX}{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Counts:
    """What the groups run came to, by outcome."""

    def __init__(self) -> None:
        self.by_outcome: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self.events_succeeded = 0

    def record(self, result: BatchResult) -> None:
        self.by_outcome[result.outcome] += 1
        self.events_succeeded += result.succeeded

    def groups(self) -> int:
        return sum(self.by_outcome.values())


@contextmanager
def _started(app: Outbox, handlers: list[Handler[Any]]) -> Iterator[None]:
    """The handler objects started (each ``outbox_start``), and stopped after, as a worker
    starts and stops them; what a stop raises is logged."""
    lifecycle.start_all(app, handlers, log)
    try:
        yield
    finally:
        lifecycle.stop_all(handlers, log)


class _Caller:
    """One run-once caller while it works: its id, the jobs it holds, its heartbeat."""

    def __init__(self, app: Outbox) -> None:
        self.app = app
        self.id = _caller_id()
        self._lock = threading.Lock()
        self._holding: set[int] = set()
        self._stopping = threading.Event()
        self.asked = threading.Event()
        """An operator asked it to drain or stop (``outbox workers drain|stop``): it starts
        no more jobs."""
        self.heartbeat = Heartbeat(
            app, self.id, 1, running=self.holding, stopping=self._stopping.is_set
        )

    def holding(self) -> list[int]:
        """The jobs it runs now: the leases its heartbeat extends."""
        with self._lock:
            return sorted(self._holding)

    def hold(self, job_id: int) -> None:
        with self._lock:
            self._holding.add(job_id)

    def let_go(self, job_id: int) -> None:
        with self._lock:
            self._holding.discard(job_id)

    def beat_until_stopped(self) -> None:
        """Heartbeat every interval until it stops, and read what an operator asked of it; a
        failed beat is logged, and the next one tried at its time (the leases last a whole
        lease meanwhile)."""
        interval = heartbeat_interval(self.app.settings)
        while not self._stopping.wait(interval):
            try:
                self.heartbeat.run_once()
                asked = self.heartbeat.asked()
            except DBAPIError as error:
                log.warning(_log.WORKER_DATABASE_ERROR, worker=self.id, error=error_summary(error))
                continue
            if asked is not None and not self.asked.is_set():
                # Drain or stop alike: a run holds one job, which finishes either way.
                log.info(
                    _log.WORKER_ASKED,
                    worker=self.id,
                    request=asked.request,
                    requested_by=asked.requested_by,
                    in_flight=len(self.holding()),
                    known=asked.request in set(schema.WorkerRequest),
                )
                if asked.request in set(schema.WorkerRequest):
                    self.asked.set()

    def stop(self) -> None:
        self._stopping.set()

    def run(
        self,
        handlers: list[Handler[Any]],
        record: Callable[[BatchResult], None],
        *,
        deadline: float,
        max_groups: int | None,
        done: Callable[[], int],
        stop: threading.Event,
    ) -> Stopped:
        """Lease one due job at a time and run it through the runner, until none is due, the
        deadline, ``max_groups`` or ``stop``. A claim job stops claiming as soon as one of the
        last three comes (the runner's ``stopping``), and goes back to the job table. A handler
        whose buffer table is found missing is set aside while the others go on; then
        BufferTableMissingError names it."""
        names = [h.name for h in handlers]
        flow = FlowState(self.app, refresh_every=FLOW_STATE_REFRESH_SECONDS)
        throughput = Throughput(self.app)
        set_aside: dict[str, str] = {}

        def why_stop() -> Stopped | None:
            if stop.is_set() or self.asked.is_set():
                return Stopped.STOPPED
            if max_groups is not None and done() >= max_groups:
                return Stopped.MAX_GROUPS
            if time.monotonic() >= deadline:
                return Stopped.BUDGET
            return None

        def note_missing(missing: Mapping[str, str]) -> None:
            found = {h: t for h, t in missing.items() if h not in set_aside}
            set_aside.update(found)
            for name, table in found.items():
                log.error(_log.BUFFER_TABLE_MISSING, worker=self.id, handler=name, table=table)

        runner = Runner(
            self.app,
            worker_id=self.id,
            handlers={h.name: h for h in handlers},
            flow=flow,
            claims_in_flight=1,
            on_result=record,
            throughput=throughput,
            set_aside=note_missing,
            database_error=self._report_database_error,
            hold=self.hold,
            let_go=self.let_go,
            stopping=lambda: why_stop() is not None,
        )
        try:
            while (stopped := why_stop()) is None:
                flow.refresh_if_due()
                jobs = acquisition.acquire(
                    self.app,
                    worker_id=self.id,
                    serving=[name for name in names if name not in set_aside],
                    handlers=names,
                    cap=runner.cap,
                    probing=flow.probing,
                    limit=1,
                )
                if not jobs:
                    stopped = Stopped.IDLE
                    break
                (job,) = jobs
                self.hold(job.id)
                try:
                    crash_point(AFTER_ACQUIRE)
                    runner.run(job)
                finally:
                    self.let_go(job.id)
        finally:
            try:
                throughput.run_once()
            except DBAPIError as error:
                # Only the dashboard's counts of this run are lost; what raised goes on up.
                self._report_database_error(error)
        if set_aside:
            raise BufferTableMissingError(set_aside)
        return stopped

    def _report_database_error(self, error: DBAPIError) -> None:
        # A count missed it (the circuit breaker's, or this run's throughput); the outcome is
        # written. A run is short: each such error is said, not once per outage as a worker.
        log.warning(_log.WORKER_DATABASE_ERROR, worker=self.id, error=error_summary(error))


@contextmanager
def _registered(app: Outbox) -> Iterator[_Caller]:
    """A caller registered in ``outbox_workers`` and heartbeating while it works; its row is
    deleted at the end."""
    caller = _Caller(app)
    caller.heartbeat.run_once()
    beating = threading.Thread(
        target=caller.beat_until_stopped, name="outbox-run-once-heartbeat", daemon=True
    )
    beating.start()
    try:
        yield caller
    finally:
        caller.stop()
        beating.join()
        try:
            run_in_transaction(app.engine, lambda conn: queries.delete_worker(conn, caller.id))
        except DBAPIError as error:
            # Left behind, it is forgotten by a later run's rescue (rescue_once); what
            # raised, if anything, goes on up.
            log.warning(_log.WORKER_DATABASE_ERROR, worker=caller.id, error=error_summary(error))


@dataclass(frozen=True, slots=True)
class _Left:
    backlog: int
    capped: bool
    oldest_age: float | None
    next_due_in: float | None


def _left(app: Outbox, handlers: list[Handler[Any]]) -> _Left:
    """What the handlers have left: events, the oldest one's age, and when work is due."""

    def read(conn: Connection) -> _Left:
        states = queries.handler_states(conn)
        backlog, capped, ages, due = 0, False, [], []
        for h in handlers:
            for unclaimed in (True, False):
                n = queries.count_buffer_rows(
                    conn, h.table, unclaimed=unclaimed, cap=BACKLOG_COUNT_CAP
                )
                backlog += n
                capped = capped or n >= BACKLOG_COUNT_CAP
            age = queries.oldest_event_age(conn, h.table)
            if age is not None:
                ages.append(age)
            state = states.get(h.name)
            paused = state is not None and state.paused
            if not paused and (
                queries.undistributed_age(conn, h.table, h.name, claimable(h)) is not None
            ):
                due.append(0.0)  # waiting for a distribution: due now
        soonest = queries.next_job_due(conn, [h.name for h in handlers])
        if soonest is not None:
            due.append(soonest)
        return _Left(backlog, capped, max(ages, default=None), min(due, default=None))

    with app.engine.connect() as conn:
        return read(conn)
