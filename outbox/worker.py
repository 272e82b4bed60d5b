"""The worker: runs claim and batch jobs, heartbeats, extends leases, rescues the dead.

Concurrency is a pool of threads. Handlers push events to slow HTTP APIs and brokers, so they
spend their time waiting on I/O, where threads release the GIL; threads share one connection
pool and need no pickling of handlers. For CPU-bound handlers, run several worker processes.

Shutdown has two stages. :meth:`Worker.stop` stops taking work and lets in-flight jobs finish
within the grace period; whatever is still running then is abandoned and its leases expire, so
another worker rescues it (async handlers abandoned so are cancelled). :meth:`Worker.abort`
abandons in-flight jobs at once. Both are idempotent; signals are wired to them in exactly one
place, the CLI. :meth:`Worker.drain` stops taking work and waits for what it holds however long
that takes. An operator asks a worker on another host to drain or stop through its row in
``outbox_workers`` (``outbox workers drain``), read at each heartbeat.
"""

from __future__ import annotations

import functools
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.exc import DBAPIError

from outbox import lifecycle
from outbox._core import log as _log
from outbox._core.faults import AFTER_ACQUIRE, crash_point
from outbox._db import check_buffer_tables, generation, queries, run_in_transaction
from outbox._db.dialects import behind_pooler, error_summary
from outbox._engine import acquisition, claimer, distributor
from outbox._engine import invoke as _invoke
from outbox._engine import limiter as _limiter
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import CLAIM_LOOP_SECONDS as CLAIM_LOOP_SECONDS
from outbox._engine.runner import CLAIMS_IN_FLIGHT_PER_HANDLER as CLAIMS_IN_FLIGHT_PER_HANDLER
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner, new_worker_id
from outbox._engine.stats import WorkerStats as WorkerStats
from outbox._engine.stats import stopped_fields
from outbox._engine.wake_schedule import WakeSchedule
from outbox._services.heartbeat import Heartbeat
from outbox._services.listener import Listener
from outbox._services.maintenance import Maintenance
from outbox._services.missing_tables import MissingTables
from outbox._services.outage import Outage
from outbox._services.throughput import Throughput
from outbox.app import Outbox
from outbox.exceptions import BufferTableMissingError, SchemaIncompatibleError
from outbox.handler import Handler
from outbox.ops import buffer_clock, fleet
from outbox.results import BatchResult

log = _log.get_logger(__name__)

DEFAULT_CONCURRENCY = 4
# The most jobs one worker runs at once, a thread each. Handlers waiting on I/O gain little
# past a few hundred threads (the database connections they share run out first); many more
# fail to start at all ("can't start new thread"). A larger number is a typo.
MAX_CONCURRENCY = 1000
DEFAULT_SHUTDOWN_GRACE_PERIOD_SECONDS = 30.0
MAX_ERROR_BACKOFF_SECONDS = 30.0
MAINTENANCE_JOIN_SECONDS = 10.0
# How often the fleet's leader distributes, unless told otherwise: events wait at most about
# this long for a claim job when no notification wakes a worker, the same as the default poll
# interval, so that a fleet without LISTEN (MariaDB, SQLite, a pooler) starts on new events
# within a second or two. One distribution is a capped count and an insert per handler, a few
# milliseconds, and only the leader runs it, however many workers there are.
DEFAULT_DISTRIBUTE_EVERY_SECONDS = 1.0


class Worker:
    """Runs the jobs of an application's handlers until stopped (or, in burst mode, idle).

    ``concurrency``: jobs run at once (at most ``MAX_CONCURRENCY``). ``handlers``: names to
    serve (all when empty). ``burst``: distribute whenever idle, and return once nothing is due
    now (a group its rate limits gave back for a turn within the wait a worker holds a group
    for is waited for).
    ``distribute_every``: seconds between distributions by the fleet's leader (default
    ``DEFAULT_DISTRIBUTE_EVERY_SECONDS``; None: never, run ``outbox distribute`` from cron
    instead; the leader then logs ``outbox.distribute.missing`` when events wait with nothing
    distributing them). ``on_result``: called from a worker thread
    with each :class:`BatchResult`. ``claims_in_flight``: claims of one handler run at once
    (see ``CLAIMS_IN_FLIGHT_PER_HANDLER``).
    """

    def __init__(
        self,
        app: Outbox,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        handlers: tuple[str, ...] | list[str] = (),
        burst: bool = False,
        distribute_every: float | None = DEFAULT_DISTRIBUTE_EVERY_SECONDS,
        shutdown_grace_period: float = DEFAULT_SHUTDOWN_GRACE_PERIOD_SECONDS,
        on_result: Callable[[BatchResult], None] | None = None,
        claims_in_flight: int = CLAIMS_IN_FLIGHT_PER_HANDLER,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if concurrency > MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be <= {MAX_CONCURRENCY}, got {concurrency}")
        if claims_in_flight < 1:
            raise ValueError(f"claims_in_flight must be >= 1, got {claims_in_flight}")
        if distribute_every is not None and not 0 < distribute_every < math.inf:
            raise ValueError(
                f"distribute_every must be > 0 seconds and finite (None: never), "
                f"got {distribute_every!r}"
            )
        if not shutdown_grace_period >= 0:  # NaN too: it would abandon in-flight work at once
            raise ValueError(
                f"shutdown_grace_period must be >= 0 seconds, got {shutdown_grace_period!r}"
            )
        self.app = app
        self.handlers = {h.name: h for h in app.select_handlers(handlers)}
        self.concurrency = concurrency
        self.claims_in_flight = claims_in_flight
        self.burst = burst
        self.shutdown_grace_period = shutdown_grace_period
        self.on_result = on_result
        self.id = new_worker_id()
        self.stats = WorkerStats()
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._running: set[int] = set()
        """Ids of the jobs this worker holds and is working on: the leases it extends."""
        self._wake = threading.Event()
        self._wake_schedule = WakeSchedule()
        self._stopping = threading.Event()
        self._aborted = threading.Event()
        self._draining = threading.Event()
        self._threads: list[threading.Thread] = []
        self._outage = Outage(self.id, log)
        self._tables = {h.table.name: h.name for h in self.handlers.values()}
        self._notified: set[str] = set()
        self._notified_lock = threading.Lock()
        self._missing = MissingTables(app, self.id, self.handlers, log)
        self._listener: Listener | None = None
        self._flow = FlowState(app, refresh_every=FLOW_STATE_REFRESH_SECONDS)
        self._throughput = Throughput(app)
        heartbeat = Heartbeat(
            app,
            self.id,
            self.concurrency,
            running=self._running_now,
            stopping=self._stopping.is_set,
        )
        self._maintenance = Maintenance(
            app,
            self.id,
            log,
            heartbeat=heartbeat,
            throughput=self._throughput,
            outage=self._outage,
            missing=self._missing,
            distribute_every=distribute_every,
            distribute=self._distribute,
            in_flight=lambda: self.in_flight,
            wake=self._wake.set,
            drain=self.drain,
            stop=self.stop,
            stopping=self._stopping,
            aborted=self._aborted,
        )
        """Heartbeats, rescue, the schema, distribution: :mod:`outbox._services.maintenance`."""
        self._maintenance_thread: threading.Thread | None = None
        self._runner = Runner(
            app,
            worker_id=self.id,
            handlers=self.handlers,
            flow=self._flow,
            stats=self.stats,
            claims_in_flight=claims_in_flight,
            on_result=self._on_result,
            throughput=self._throughput,
            note_due=self._wake_schedule.note_due,
            note_turn=self._wake_schedule.note_turn,
            set_aside=self._missing.set_aside,
            database_error=self._breaker_database_error,
            hold=lambda job_id: self._hold([job_id]),
            let_go=self._let_go,
            stopping=self._stopping.is_set,
            heard=heartbeat.heard,
        )
        """Runs each job this worker leases (:mod:`outbox._engine.runner`)."""

    @property
    def schema_incompatible(self) -> SchemaIncompatibleError | None:
        """Why this worker stopped on its own: a schema too new for it or downgraded; or None."""
        return self._maintenance.schema_incompatible

    @property
    def live_workers(self) -> int:
        """Live workers in the fleet, as of this worker's last heartbeat."""
        return self._maintenance.live_workers

    @live_workers.setter
    def live_workers(self, count: int) -> None:
        self._maintenance.live_workers = count

    @property
    def distribute_every(self) -> float | None:
        """Seconds between the leader's distributions (None: never), read at each pass."""
        return self._maintenance.distribute_every

    @distribute_every.setter
    def distribute_every(self, seconds: float | None) -> None:
        self._maintenance.distribute_every = seconds

    @property
    def leading(self) -> bool:
        """Whether this worker led the fleet at its last heartbeat (it distributes)."""
        return self._maintenance.leading

    # --- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop taking work; in-flight jobs finish within the grace period (after a
        :meth:`drain`, too). Idempotent."""
        self._draining.clear()
        self._stop_taking_work()

    def drain(self) -> None:
        """Stop taking work; in-flight jobs finish, however long they take (no grace period),
        unless :meth:`stop` or :meth:`abort` comes after. Idempotent."""
        self._draining.set()
        self._stop_taking_work()

    def _stop_taking_work(self) -> None:
        if not self._stopping.is_set():
            log.info(_log.WORKER_STOPPING, worker=self.id, in_flight=self.in_flight)
        self._stopping.set()
        self._wake.set()

    def abort(self) -> None:
        """Stop at once; in-flight jobs are abandoned and their leases expire. Idempotent."""
        self._aborted.set()
        self.stop()

    @property
    def in_flight(self) -> int:
        """Jobs running now."""
        with self._in_flight_lock:
            return self._in_flight

    # --- one round -----------------------------------------------------------------------

    def run_once(self) -> int:
        """Lease up to ``concurrency`` due jobs and run them here, one after the other.

        Returns how many jobs ran, each through the runner (:mod:`outbox._engine.runner`), as
        in :meth:`run`. A job that found its buffer table missing is given back
        untouched and its handler set aside (see :attr:`missing_tables`); once the other jobs
        have run, BufferTableMissingError names the tables.
        """
        known = set(self.missing_tables)
        self._flow.refresh_if_due()
        jobs = self._acquire(self.concurrency)
        for job in jobs:
            self._run_job(job)
        found = {h: t for h, t in self.missing_tables.items() if h not in known}
        if found:
            raise BufferTableMissingError(found)
        return len(jobs)

    @property
    def missing_tables(self) -> dict[str, str]:
        """Handlers set aside because their buffer table does not exist: handler -> table. A
        worker refuses to start when a table is missing; one dropped while it runs sets its
        handler aside, whose jobs wait untouched while the others go on; :meth:`run` looks
        again every ``rescue_interval`` and takes the handler back once the table is there."""
        return self._missing.missing

    def rescue(self) -> int:
        """Free the jobs of expired leases; once this worker's own heartbeats have been steady
        for ``worker_stale_after``, free the jobs of workers gone silent too, and forget them."""
        return self._maintenance.rescuer.run_once()

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> bool:
        """Work until stopped (or idle, in burst mode). True when nothing was abandoned.

        Raises BufferTableMissingError, before doing anything, when a buffer table of its
        handlers does not exist (see :attr:`missing_tables` for one that goes missing later),
        and SchemaIncompatibleError when the database's schema is one it may not work on (see
        :attr:`schema_incompatible` for a schema that becomes one while it runs).
        Raises LocalClockError when a buffer's ``created_at`` defaults to the session's local
        clock and this session is not in UTC (MariaDB; ``outbox migrate-buffers``).
        """
        check_buffer_tables(self.app.engine, {name: h.tables for name, h in self.handlers.items()})
        generation.check(self.app.engine)
        buffer_clock.enforce(self.app, [h.table for h in self.handlers.values()])
        self.start_handlers()
        self._maintenance.heartbeat()  # its row, and the fleet's first word of it
        log.info(
            _log.WORKER_STARTED,
            worker=self.id,
            concurrency=self.concurrency,
            claims_in_flight=self.claims_in_flight,
            handlers=sorted(self.handlers),
            burst=self.burst,
            distribute_every=self.distribute_every,
        )
        for line in fleet.start_warnings(self.app, self.handlers.values()):
            log.warning(_log.OLDER_WORKERS, worker=self.id, detail=line)
        for n in range(self.concurrency):
            thread = threading.Thread(
                target=self._thread_main, name=f"outbox-worker-{n}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        self._maintenance_thread = threading.Thread(
            target=self._maintenance.main, name="outbox-maintenance", daemon=True
        )
        self._maintenance_thread.start()
        if self.app.settings.listen and not self.burst and self.app.supports.listen_notify:
            if behind_pooler(self.app.engine):
                # A transaction pooler lends a server session per transaction: a LISTEN
                # would be left on a session that then serves others, and hear nothing.
                log.info(_log.LISTENER_OFF, worker=self.id, reason="connection pooler")
            else:
                self._listener = Listener(self.app, self._on_notify)
                self._listener.start()
        try:
            self._loop()
        finally:
            clean = self._shutdown()
        return clean

    def _loop(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            try:
                self._flow.refresh_if_due()
                self._react_to_notifications()
                acquired = self._fill()
                idle_burst = not acquired and self.in_flight == 0 and self.burst
                if idle_burst and not self._burst_has_more():
                    turn = self._next_turn()
                    if turn is None:
                        return
                    # A group its rate limit gave back is the fleet's own pacing, due within
                    # the wait a worker holds a group for: a burst run handles it too.
                    self._stopping.wait(turn)
                self._outage.recovered()
                backoff = 0.0
            except DBAPIError as error:
                backoff = min(max(backoff * 2, 0.5), MAX_ERROR_BACKOFF_SECONDS)
                self._maintenance.suspect_schema(error)
                self._outage.report(error)
                self._outage.back_off(
                    self.app.engine, backoff * (0.5 + random.random()), self._stopping
                )
                continue
            if acquired or idle_burst:
                continue
            self._wake.wait(self._poll_timeout())
            self._wake.clear()

    def _on_notify(self, payload: str) -> None:
        """A notification: new events in a buffer of ours, or new jobs.

        New events: the leader distributes for their handler at once (only the leader, so
        that a fleet of N workers runs one distribution per commit, not N); its distribution
        announces the new claim jobs, which wakes the idle workers.
        """
        handler = self._tables.get(payload)
        if handler is not None:
            if not self.leading or handler not in self._missing.serving:
                return
            with self._notified_lock:
                self._notified.add(handler)
        self._wake.set()

    def _react_to_notifications(self) -> None:
        """New events were announced: claim them here if a slot is free, else distribute.

        A direct claim skips the claim job (and its round trips); a capped handler always goes
        through distribution, so that its cap is enforced where jobs are leased.
        """
        with self._notified_lock:
            names, self._notified = sorted(self._notified), set()
        for name in names:
            if self._flow.paused(name):
                continue
            if self._cap(name) is None and self._take_slot():
                self._tasks.put(functools.partial(self._claim_directly, name))
            else:
                self._distribute([name])

    def _take_slot(self) -> bool:
        with self._in_flight_lock:
            if self._in_flight >= self.concurrency:
                return False
            self._in_flight += 1
            return True

    def _fill(self) -> int:
        free = self.concurrency - self.in_flight
        if free <= 0 or not self._maintenance.heartbeat_service.heard():
            # Not heard lately, the fleet may take this worker for gone: what it leased now
            # would only go back (Runner._lease_too_old).
            return 0
        jobs = self._acquire(free)
        with self._in_flight_lock:
            self._in_flight += len(jobs)
        for job in jobs:
            self._tasks.put(functools.partial(self._run_job, job))
        return len(jobs)

    def _burst_has_more(self) -> bool:
        """In burst mode, when idle: rescue and distribute; anything new to do now?"""
        self.rescue()
        if self._distribute(self._missing.serving):
            return True
        return bool(self._fill())

    def _poll_timeout(self) -> float:
        """Coordinated polling: the fleet as a whole polls once per ``poll_interval``.

        Each idle worker waits the interval times the number of live workers, jittered by
        ±50%, so that the database sees the same polling load from 2 workers as from 200.
        Work finishing in this worker, notifications, and the moment a group this worker put
        off is due again (a ``RetryAfter(5)`` is back in about 5 s and a tenth, not 5 s plus a
        poll interval per live worker) wake it sooner.
        """
        return self._wake_schedule.poll_timeout(self.app.settings.poll_interval * self.live_workers)

    def _next_turn(self) -> float | None:
        """Seconds until the next group this worker's rate limits gave back is due, when that is
        within the wait a worker holds a group for its turn; None otherwise."""
        return self._wake_schedule.next_turn(_limiter.max_wait(self.app))

    def _acquire(self, limit: int) -> list[queries.JobRow]:
        """Lease up to ``limit`` due jobs (capped handlers first: see
        :func:`outbox._engine.acquisition.acquire`)."""
        jobs = acquisition.acquire(
            self.app,
            worker_id=self.id,
            serving=self._missing.serving,
            handlers=list(self.handlers),
            cap=self._cap,
            probing=self._flow.probing,
            limit=limit,
        )
        if jobs:
            self._hold(job.id for job in jobs)
            crash_point(AFTER_ACQUIRE)
        return jobs

    def _cap(self, name: str) -> int | None:
        """The most groups of a handler in flight fleet-wide (see :meth:`Runner.cap`)."""
        return self._runner.cap(name)

    def _running_now(self) -> list[int]:
        with self._in_flight_lock:
            return sorted(self._running)

    def _hold(self, job_ids: Iterable[int]) -> None:
        with self._in_flight_lock:
            self._running.update(job_ids)

    def _let_go(self, job_id: int) -> None:
        with self._in_flight_lock:
            self._running.discard(job_id)

    def _thread_main(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            try:
                task()
            except DBAPIError as error:  # its full text may quote event values: summary only
                self._maintenance.suspect_schema(error)
                log.error(_log.WORKER_LOOP_ERROR, worker=self.id, error=error_summary(error))
            except Exception as error:  # the loop must survive anything a job throws
                log.exception(_log.WORKER_LOOP_ERROR, worker=self.id, error=str(error))
            finally:
                with self._in_flight_lock:
                    self._in_flight -= 1
                self._wake.set()

    def _run_job(self, job: queries.JobRow) -> None:
        try:
            self._runner.run(job)
        finally:
            self._let_go(job.id)

    def _claim_directly(self, name: str) -> None:
        """Claim a group without a claim job (woken by a notification) and handle it."""
        handler = self.handlers[name]
        try:
            claim = claimer.run_once(self.app, handler, lease_to=self.id)
        except DBAPIError as error:
            if self._runner.table_missing(handler, error) is None:
                raise
            return
        self._runner.handle_claim(claim)
        if claim is not None and claim.size == handler.batch_size:
            # A full batch: more is probably waiting; let the fleet's claim jobs take it.
            self._distribute([name])

    def _on_result(self, result: BatchResult) -> None:
        if self.on_result is not None:
            self.on_result(result)

    def _breaker_database_error(self, error: DBAPIError) -> None:
        self._maintenance.suspect_schema(error)
        self._outage.report(error)

    # --- the fleet: distribution and heartbeats ----------------------------------------------

    def _distribute(self, names: list[str]) -> int:
        """Distribute for these handlers; returns the claim jobs enqueued. A handler whose
        buffer table is missing is set aside, and the others are distributed for all the same."""
        handlers = [self.handlers[name] for name in names]
        done = distributor.distribute(self.app, handlers, on_missing=self._missing.set_aside)
        return distributor.enqueued(done)

    def _heartbeat(self) -> None:
        """Heartbeat now (the maintenance thread does at each interval)."""
        self._maintenance.heartbeat()

    # --- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> bool:
        self._stopping.set()
        if self._listener is not None:
            self._listener.stop()
        deadline: float | None = None
        while self.in_flight and not self._aborted.is_set():
            # Draining waits for as long as the jobs take; a stop (or one after the drain)
            # gives them the grace period from then.
            if self._draining.is_set():
                deadline = None
            else:
                if deadline is None:
                    deadline = time.monotonic() + self.shutdown_grace_period
                if time.monotonic() >= deadline:
                    break
            self._wake.wait(0.1)
            self._wake.clear()
        abandoned = self.in_flight
        for _ in self._threads:
            self._tasks.put(None)
        if abandoned:
            log.warning(_log.WORKER_ABANDONED, worker=self.id, in_flight=abandoned)
            # Unlike a thread, a coroutine can be stopped: it runs its cleanup now rather than
            # being cut off mid-way when the process exits, or running on after its worker.
            _invoke.cancel_calls_from(self._threads)
        self._aborted.set()
        if self._maintenance_thread is not None:
            # A heartbeat under way must not re-insert the row deleted below.
            self._maintenance_thread.join(timeout=MAINTENANCE_JOIN_SECONDS)
        # Each on its own: counts that cannot be written must not keep the worker's row
        # behind, where the fleet would take it for alive until it went stale.
        try:
            self.flush_throughput()
        except DBAPIError as error:
            self._outage.report(error)
        if not abandoned:
            try:
                run_in_transaction(
                    self.app.engine, lambda conn: queries.delete_worker(conn, self.id)
                )
            except DBAPIError as error:
                self._outage.report(error)
        self.stop_handlers()
        log.info(_log.WORKER_STOPPED, worker=self.id, **stopped_fields(self.stats))
        return abandoned == 0

    def flush_throughput(self) -> None:
        """Write what the handlers handled since the last write (``outbox_throughput``): the
        maintenance thread does at every heartbeat, and the worker when it stops. Not on a
        schema it may not work on (:attr:`schema_incompatible`): the table may be gone, and the
        counts since the last write are not kept."""
        if self.schema_incompatible is None:
            self._throughput.run_once()

    def start_handlers(self) -> None:
        """Each handler object's ``outbox_start`` (:mod:`outbox.lifecycle`): what it raises (a
        downstream that cannot be reached, a configuration it refuses) stops the worker here,
        before it runs any group, rather than failing every group."""
        lifecycle.start_all(self.app, self.handlers.values(), log, worker=self.id)

    def stop_handlers(self, handlers: Iterable[Handler[Any]] | None = None) -> None:
        """Each handler object's ``outbox_stop``, once; what one raises is logged."""
        lifecycle.stop_all(
            self.handlers.values() if handlers is None else handlers, log, worker=self.id
        )
