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
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from outbox._core import log as _log
from outbox._db import check_buffer_tables, generation, queries, run_in_transaction
from outbox._engine import distributor
from outbox._engine.claimer import claimable
from outbox._once.caller import Counts, caller_id, handlers_started, registered
from outbox._once.results import (
    DistributionResult,
    HandlerDistribution,
    RescueResult,
    RunResult,
    Stopped,
    WorkResult,
)
from outbox._services import retention
from outbox._services.rescuer import Rescuer
from outbox.app import Outbox
from outbox.handler import Handler
from outbox.ops import buffer_clock
from outbox.ops.scaling import read_scaling
from outbox.results import Outcome

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
    rescued = Rescuer(app, caller_id()).run_once()
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
    check_buffer_tables(app.engine, {h.name: h.tables for h in selected})
    generation.check(app.engine)
    with _CLOCK_WARNED_LOCK:
        # Once per application and process: a web application's task calls every few seconds.
        warn = id(app) not in _CLOCK_WARNED
        _CLOCK_WARNED.add(id(app))
    buffer_clock.enforce(app, [h.table for h in selected], warn=warn)
    counts = Counts()
    started = time.monotonic()
    with handlers_started(app, selected, log), registered(app, log) as caller:
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
    leases ended, are handled in this run rather than the next. A pass of the archive's
    retention follows the distribution, at most every ten minutes in a process
    (``Settings.archive_retention_days``; the archive's days ahead are made either way).
    """
    rescued = rescue_once(app)
    distributed = distribute_once(app, every=every, handlers=handlers)
    # From cron, where no `outbox work` may run: the archive's days ahead, and its retention.
    retention.pass_if_due(app)
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


# --- what is left -------------------------------------------------------------------------------


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
