"""outbox on the application's own Celery: claim and batch jobs as Celery tasks.

One call, :func:`install`, puts outbox on a Celery application (the application, its broker
and its result backend stay the user's)::

    from celery import Celery
    from outbox.executors.celery import install

    celery = Celery("shop", broker="amqp://guest:guest@localhost//")
    executor = install(celery, outbox_app)

and two commands run it, beside the application's own workers::

    celery -A shop.tasks worker --queues outbox --concurrency 4
    celery -A shop.tasks beat

It registers three tasks, whose messages all go to a queue of their own (``queue``, named in
each message's options, so the application's ``task_routes`` and long tasks never hold them
up):

``outbox.distribute``
    On the beat schedule ``BEAT_SENDS_PER_TICK`` times every ``distribute_every`` seconds: the
    claim jobs the handlers' unclaimed events need (:func:`outbox.once.distribute_once` on the
    tick the beat sent the message in, stamped in its ``SENT_AT_HEADER``), then a message for
    each new claim job. The tick is taken in the database, per handler: of any number of
    messages naming one tick (from any number of beats), one distributes, and the others find
    the tick taken and do nothing. A message that waits in the queue past its tick's end still
    takes its own tick.
``outbox.run_job``
    Runs one job, named by its id in the message, through the job runner that ``outbox work``
    runs it with: a claim job claims full batches and hands each to its handler at once, for
    up to a second, exactly as under ``outbox work``; a batch job hands its group to its
    handler. Pauses, rate limits, fleet-wide caps, circuit breakers and ordering live in the
    database and hold across Celery workers and ``outbox work`` processes alike.
``outbox.rescue``
    On the beat schedule every ``rescue_every`` seconds: frees the jobs of gone workers and of
    expired leases, then publishes a message for each job it freed and for any due job that no
    message has taken for ``OVERDUE_AFTER_SECONDS`` (a message lost with a broker, or never
    published), at most ``SWEEP_LIMIT`` a run. In a process not yet allowed to judge another
    worker gone (a child started just now), it frees expired leases only and sends itself on
    for another process (at most ``RESCUE_HOPS`` times).

The job table stays the source of truth. A message names a job; the task leases that job only
when it is due and unleased, so a message delivered twice (a visibility timeout, ``acks_late``,
a lost worker, a duplicate publish) finds it leased or gone and does nothing (logged at debug,
``outbox.executor.skipped``). Nothing depends on ``acks_late`` or
``task_reject_on_worker_lost``: a killed worker loses only its lease.

Each worker process (each prefork child) registers in ``outbox_workers`` and heartbeats, so
``outbox status`` and the console show it like any worker, its running job's lease is
extended, and a killed child's jobs are freed once its heartbeat goes silent, not at lease end.
Engines are made per child: the pool a child inherits from the parent is disposed of
(``engine.dispose(close=False)``) when it starts. A child stopped with SIGTERM (Celery's cold
shutdown, the end of a ``worker_soft_shutdown_timeout``) gives back the leases it holds, and
their work is taken again at once. ``outbox workers drain`` or ``stop`` of one of them, read at
its heartbeat, shuts its Celery worker down warm.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from celery import Celery, signals
from sqlalchemy.exc import DBAPIError

from outbox import _log, lifecycle, once, schema
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import is_transient
from outbox._engine.distributor import MAX_TICK_SECONDS, MIN_TICK_SECONDS, tick_of
from outbox._engine.runner import JobRun, Runner, RunOutcome, lease_job
from outbox._services.heartbeat import Heartbeat, heartbeat_interval
from outbox._services.outage import Outage
from outbox._services.rescuer import Rescuer
from outbox._services.schema_watch import SchemaWatch
from outbox._services.throughput import Throughput
from outbox.app import Handler, Outbox
from outbox.exceptions import BufferTableMissingError, SchemaIncompatibleError

__all__ = [
    "BEAT_ENTRIES",
    "BEAT_SENDS_PER_TICK",
    "DEFAULT_DISTRIBUTE_EVERY_SECONDS",
    "DEFAULT_QUEUE",
    "DISTRIBUTE_TASK",
    "MAX_COUNTDOWN_SECONDS",
    "OVERDUE_AFTER_SECONDS",
    "RESCUE_TASK",
    "RUN_JOB_TASK",
    "SENT_AT_HEADER",
    "SWEEP_LIMIT",
    "CeleryExecutor",
    "install",
]

log = _log.get_logger(__name__)

DEFAULT_QUEUE = "outbox"
DEFAULT_DISTRIBUTE_EVERY_SECONDS = 1.0
"""Seconds between distributions: a new event waits about this long for its claim job (the
same as ``outbox work``'s default)."""
RUN_JOB_TASK = "outbox.run_job"
DISTRIBUTE_TASK = "outbox.distribute"
RESCUE_TASK = "outbox.rescue"
BEAT_ENTRIES = (DISTRIBUTE_TASK, RESCUE_TASK)
"""The names of the entries :func:`install` adds to the beat schedule (the tasks' own names)."""
OVERDUE_AFTER_SECONDS = 30.0
"""A due job that no message has taken for this long gets one from the rescue task's sweep. A
message waiting behind a queue's backlog is taken for lost too, and its job gets a second one,
which finds the job leased or gone: a no-op."""
SWEEP_LIMIT = 100
"""The most messages one sweep publishes for overdue jobs (the most urgent first)."""
MAX_COUNTDOWN_SECONDS = 300.0
"""A group due again within this long (a retry's backoff, a deferral, a rate limit's turn) gets
its message at once with a countdown; one due later is left to the sweep, so that a worker does
not hold hours of countdown messages in memory."""
DUE_MARGIN_SECONDS = 0.05
"""A countdown message arrives this long after its job is due: the database's clock decides."""
MESSAGE_EXPIRY_PERIODS = 10
BEAT_SENDS_PER_TICK = 4
"""The beat sends ``outbox.distribute`` this many times a tick: a beat sends each entry a
little later than its period (about 1.24 s for 1 s here), and a tick that no message names is
not distributed. Each message names the tick it was sent in (``SENT_AT_HEADER``); the first to
run takes it, the others find it taken (at no cost in a process that took or found it taken
already), and extra messages cost little."""
SENT_AT_HEADER = "outbox_sent_at"
"""The header a distribution message carries: when it was sent (Unix seconds, by the sending
host's clock), which names the tick the message is for."""
RECENT_TICKS = 16
"""Ticks a process remembers having taken or found taken, so that the other messages of one
tick cost it no statement."""
RESCUE_HOPS = 3
"""How many times a rescue that ran in a process not yet allowed to judge another worker gone
sends itself on (at once, then when the process will be allowed)."""
"""A beat message that waited this many of its periods is dropped: a later one does its work."""
GIVE_BACK_SECONDS = 5.0
"""How long a child stopped by SIGTERM spends giving back its leases before it exits anyway
(the rescue frees them then, once its heartbeat is silent)."""
STOP_JOIN_SECONDS = 5.0


# The Celery applications outbox is installed on (read without finalizing one: asking it for its
# tasks would).
_INSTALLED: weakref.WeakSet[Celery] = weakref.WeakSet()


def install(
    celery_app: Celery,
    outbox_app: Outbox,
    *,
    queue: str = DEFAULT_QUEUE,
    distribute_every: float = DEFAULT_DISTRIBUTE_EVERY_SECONDS,
    rescue_every: float | None = None,
    handlers: Sequence[str] = (),
) -> CeleryExecutor:
    """Install outbox on ``celery_app``: its three tasks and two beat entries.

    ``celery_app``: the application's ``celery.Celery``. ``outbox_app``: the :class:`Outbox`
    whose handlers run. ``queue``: the queue the tasks and their messages go to; run a worker
    that consumes it (``celery worker --queues outbox``), and only it, so that the
    application's long tasks never starve outbox's. ``distribute_every``: seconds between
    distributions (beat entry ``outbox.distribute``), also the length of the tick each
    distribution takes in the database. ``rescue_every``: seconds between rescues
    and sweeps (beat entry ``outbox.rescue``); the app's ``Settings.rescue_interval`` by
    default. ``handlers``: the names of the handlers run on this Celery application (all, by
    default, those registered when a worker process starts).

    Every setting of ``celery_app.conf`` stays as it was, but for the two entries named in
    ``BEAT_ENTRIES`` added to ``beat_schedule``; routing is by each message's ``queue`` option
    (the beat entries' and :meth:`CeleryExecutor.publish`'s), not ``task_routes``. Call it once
    per Celery application, after configuring it.

    Raises TypeError for a ``celery_app`` or ``outbox_app`` of another kind (an async engine,
    a module), ValueError for a period that is not a positive number of seconds, a blank
    queue, a handler the app does not have, or a second install on one Celery application.
    """
    if not isinstance(celery_app, Celery):
        raise TypeError(f"celery_app must be a celery.Celery application, got {celery_app!r}")
    if not isinstance(outbox_app, Outbox):
        raise TypeError(f"outbox_app must be an outbox.Outbox, got {outbox_app!r}")
    if not isinstance(queue, str) or not queue.strip():
        raise ValueError(f"queue must be a queue's name, got {queue!r}")
    _check_seconds("distribute_every", distribute_every, MIN_TICK_SECONDS, MAX_TICK_SECONDS)
    if rescue_every is not None:
        _check_seconds("rescue_every", rescue_every, MIN_TICK_SECONDS, MAX_TICK_SECONDS)
    if isinstance(handlers, str):
        raise TypeError(f"handlers must be a sequence of handler names, got {handlers!r}")
    names = tuple(handlers)
    outbox_app.select_handlers(names)  # refuses a name the app does not know
    if celery_app in _INSTALLED:
        raise ValueError(f"outbox is already installed on {celery_app.main or celery_app!r}")
    executor = CeleryExecutor(
        celery_app,
        outbox_app,
        queue=queue,
        distribute_every=float(distribute_every),
        rescue_every=float(
            outbox_app.settings.rescue_interval if rescue_every is None else rescue_every
        ),
        handlers=names,
    )
    _INSTALLED.add(celery_app)
    return executor


def _check_seconds(name: str, value: object, least: float, most: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not least <= value <= most
    ):
        raise ValueError(f"{name} must be {least:g} to {most:g} seconds, got {value!r}")


@dataclass
class _Process:
    """What one worker process (a prefork child, or a solo worker) holds: its worker row's id,
    its heartbeat, the job runner, and the jobs it runs now."""

    executor: CeleryExecutor
    worker_id: str
    handlers: dict[str, Handler[Any]]
    pid: int = field(default_factory=os.getpid)
    running: set[int] = field(default_factory=set)
    # The heartbeat's thread reads what the task threads change.
    lock: threading.Lock = field(default_factory=threading.Lock)
    slots: int = 1
    """Jobs it runs at once: one in a prefork child, the pool's size in a threads pool."""
    started: set[str] = field(default_factory=set)
    stopping: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    child: bool = False
    """A prefork child (its SIGTERM is outbox's once it runs a job)."""
    takes_sigterm: bool = False
    asked: str | None = None
    """The operator's request it acted on."""
    schema_incompatible: SchemaIncompatibleError | None = None
    """Why the database's schema is one it may not work on (it then takes no more jobs)."""
    wake: threading.Event = field(default_factory=threading.Event)
    """Set to make the heartbeat thread look at once: at the schema after a statement failed
    for good."""
    schema_suspect: threading.Event = field(default_factory=threading.Event)
    parked: set[str] = field(default_factory=set)
    """Handlers a message was dropped for while they were paused: once their pause ends, this
    process publishes their due jobs (guarded by ``lock``)."""

    def __post_init__(self) -> None:
        app = self.executor.outbox
        self.schema_watch = SchemaWatch(app)
        self.outage = Outage(self.worker_id, log)
        self.throughput = Throughput(app)
        self.heartbeat = Heartbeat(
            app, self.worker_id, self.slots, running=self.running_now, stopping=self.stopping.is_set
        )
        self.rescuer = Rescuer(
            app, self.worker_id, judge_heartbeats=self.heartbeat.may_judge_others
        )
        self.runner = Runner(
            app,
            worker_id=self.worker_id,
            handlers=self.handlers,
            throughput=self.throughput,
            hold=self.hold,
            let_go=self.let_go,
            database_error=self.outage.report,
            stopping=self.stopping.is_set,
        )
        self.thread = threading.Thread(
            target=self._heartbeat_main, name="outbox-heartbeat", daemon=True
        )

    def running_now(self) -> list[int]:
        """The jobs it runs now: the leases its heartbeat extends."""
        with self.lock:
            return sorted(self.running)

    def hold(self, job_id: int) -> None:
        with self.lock:
            self.running.add(job_id)

    def let_go(self, job_id: int) -> None:
        with self.lock:
            self.running.discard(job_id)

    def start(self) -> None:
        self.thread.start()
        log.info(
            _log.WORKER_STARTED,
            worker=self.worker_id,
            executor="celery",
            queue=self.executor.queue,
            handlers=sorted(self.handlers),
        )

    def _heartbeat_main(self) -> None:
        every = heartbeat_interval(self.executor.outbox.settings)
        next_heartbeat = time.monotonic()
        while not self.stopping.is_set():
            now = time.monotonic()
            heartbeat_due = now >= next_heartbeat
            if heartbeat_due:
                next_heartbeat = now + every
            if heartbeat_due or self.schema_suspect.is_set():
                # First, and on its own, as ``outbox work`` does: on a schema it may not work
                # on, any step below may fail, and none may keep it from finding out.
                self._watch_schema()
            try:
                if heartbeat_due:
                    self.heartbeat.run_once()
                    if self.schema_incompatible is None:
                        self.throughput.run_once()
                        self._read_request()
                if self.schema_incompatible is None:
                    self._publish_resumed()
                self.outage.recovered()
            except DBAPIError as error:
                self.suspect_schema(error)
                self.outage.report(error)
            except Exception as error:  # the heartbeat must outlive anything one beat meets
                log.exception(_log.WORKER_LOOP_ERROR, worker=self.worker_id, error=str(error))
            wait = next_heartbeat - time.monotonic()
            if self.has_parked():
                # Look for the end of a pause about once a distribution period.
                wait = min(wait, self.executor.distribute_every)
            if self.schema_suspect.is_set():
                wait = 0.0
            self.wake.wait(max(wait, 0.05))
            self.wake.clear()

    def _watch_schema(self) -> None:
        """Take no more jobs once the database's schema is one this process may not work on,
        and shut its Celery worker down warm, as ``outbox workers stop`` does. Says why once,
        in the line ``outbox work`` logs."""
        self.schema_suspect.clear()
        if self.schema_incompatible is not None:
            return
        problem = self.schema_watch.watch(self.worker_id, self.outage.report, log)
        if problem is None:
            return
        self.schema_incompatible = problem
        self.executor.shut_down_node()

    def suspect_schema(self, error: DBAPIError) -> None:
        """A statement failed for good (not contention, not a dropped connection): a table or a
        column it names may be gone. The heartbeat thread looks at the schema now rather than
        at its next beat."""
        if not is_transient(error):
            self.schema_suspect.set()
            self.wake.set()

    # --- pauses that end -------------------------------------------------------------------

    def park(self, handlers: Iterable[str]) -> None:
        """A message of these paused handlers' jobs was dropped: publish their due jobs once
        their pause ends."""
        names = set(handlers)
        if not names:
            return
        with self.lock:
            fresh = not self.parked
            self.parked |= names
        if fresh:
            self.wake.set()  # to look again within a distribution period, not a heartbeat

    def has_parked(self) -> bool:
        with self.lock:
            return bool(self.parked)

    def _publish_resumed(self) -> None:
        """Publish the due jobs of the parked handlers whose pause has ended (an operator's
        resume, a Retry-After's end, a circuit breaker's probe): at most their cap (one while
        the breaker probes), or ``SWEEP_LIMIT``."""
        with self.lock:
            parked = sorted(self.parked)
        if not parked:
            return
        flow = self.runner.flow
        flow.refresh()
        resumed = [name for name in parked if not flow.paused(name)]
        if not resumed:
            return
        with self.executor.outbox.engine.connect() as conn:
            due = {
                name: queries.overdue_jobs(
                    conn,
                    [name],
                    overdue_seconds=0.0,
                    limit=self.runner.cap(name) or SWEEP_LIMIT,
                )
                for name in resumed
            }
        with self.lock:
            self.parked -= set(resumed)
        for name, ids in due.items():
            published = self.executor.publish_all(ids)
            log.debug(_log.EXECUTOR_RESUMED, handler=name, worker=self.worker_id, jobs=published)

    def _read_request(self) -> None:
        """Act on what an operator asked of this process in its row (``outbox workers drain``
        or ``stop``), once: ask its Celery worker to shut down warm, as ``celery control
        shutdown`` does. The worker stops taking messages, its processes finish what they run,
        then leave the fleet. A request it does not know (of a newer outbox) is logged and
        left alone."""
        asked = self.heartbeat.asked()
        if asked is None or self.asked is not None:
            return
        self.asked = asked.request
        known = asked.request in set(schema.WorkerRequest)
        log.info(
            _log.WORKER_ASKED,
            worker=self.worker_id,
            request=asked.request,
            requested_by=asked.requested_by,
            in_flight=len(self.running_now()),
            known=known,
        )
        if known:
            self.executor.shut_down_node()

    def start_handler(self, handler: Handler[Any]) -> bool:
        """Its object's ``outbox_start`` once in this process (a sink connects); False when
        it raised (logged), to be tried again with the next job."""
        if handler.name in self.started:
            return True
        try:
            lifecycle.start(self.executor.outbox, handler)
        except Exception as error:
            log.error(
                _log.EXECUTOR_HANDLER_START_FAILED,
                worker=self.worker_id,
                handler=handler.name,
                error=f"{type(error).__name__}: {error}",
            )
            return False
        self.started.add(handler.name)
        return True

    def stop(self, *, give_back: bool) -> None:
        """Stop heartbeating; give back what it holds (``give_back``), write its counts, leave
        the fleet (its row deleted) and stop its handler objects. Once."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.stopping.set()
        self.wake.set()  # the heartbeat thread waits on it
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=STOP_JOIN_SECONDS)
        app = self.executor.outbox
        given = 0
        try:
            if give_back:
                given = run_in_transaction(
                    app.engine,
                    lambda conn: queries.give_back_jobs_of(conn, app.dialect, self.worker_id),
                )
            if self.schema_incompatible is None:  # its table may be gone
                self.throughput.run_once()
            run_in_transaction(app.engine, lambda conn: queries.delete_worker(conn, self.worker_id))
        except DBAPIError as error:
            self.outage.report(error)
        if given:
            log.info(_log.JOBS_GIVEN_BACK, worker=self.worker_id, jobs=given)
            self.executor.publish_rescued(given)
        lifecycle.stop_all(
            [self.handlers[name] for name in sorted(self.started)], log, worker=self.worker_id
        )
        stats = self.runner.stats
        log.info(
            _log.WORKER_STOPPED,
            worker=self.worker_id,
            executor="celery",
            groups_succeeded=stats.groups_succeeded,
            groups_retried=stats.groups_retried,
            groups_dead=stats.groups_dead,
            leases_lost=stats.leases_lost,
            events_succeeded=stats.events_succeeded,
        )


class CeleryExecutor:
    """outbox installed on a Celery application (made by :func:`install`).

    ``run_job``, ``distribute`` and ``rescue`` are the Celery tasks; :meth:`publish` sends the
    message that runs one job. The other methods are what the tasks and Celery's signals call.
    """

    def __init__(
        self,
        celery_app: Celery,
        outbox_app: Outbox,
        *,
        queue: str,
        distribute_every: float,
        rescue_every: float,
        handlers: tuple[str, ...],
    ) -> None:
        self.celery = celery_app
        self.outbox = outbox_app
        self.queue = queue
        self.distribute_every = distribute_every
        self.rescue_every = rescue_every
        self.handler_names = handlers
        self._process: _Process | None = None
        self._process_lock = threading.Lock()
        self._hostname: str | None = None
        self._slots = 1
        # The queue goes with each message (publish, the beat entries), not on the tasks:
        # Celery deprecates a task's ``queue`` attribute, and ``task_routes`` is the app's.
        options = {"ignore_result": True, "shared": False}
        self.run_job, self.distribute, self.rescue = self._tasks(options)
        self._recent_ticks: list[int] = []
        periods = (
            (DISTRIBUTE_TASK, distribute_every / BEAT_SENDS_PER_TICK, distribute_every),
            (RESCUE_TASK, rescue_every, rescue_every),
        )
        for name, sent_every, every in periods:
            celery_app.add_periodic_task(
                sent_every,
                celery_app.signature(name),
                name=name,
                queue=queue,
                expires=every * MESSAGE_EXPIRY_PERIODS,
            )
        signals.before_task_publish.connect(_stamp_sent_at, weak=False)
        signals.worker_process_init.connect(self._on_process_init, weak=False)
        signals.worker_process_shutdown.connect(self._on_process_shutdown, weak=False)
        signals.worker_ready.connect(self._on_worker_ready, weak=False)
        signals.worker_shutdown.connect(self._on_worker_shutdown, weak=False)

    # --- the tasks -------------------------------------------------------------------------

    def _tasks(self, options: dict[str, Any]) -> tuple[Any, Any, Any]:
        """The three tasks, plain functions (Celery reads their signatures) that call this
        executor."""
        # Celery is untyped: its decorator is Any, and so are the tasks it makes.
        task: Callable[..., Callable[[Callable[..., None]], Any]] = self.celery.task

        @task(name=RUN_JOB_TASK, **options)
        def run_job(job_id: int) -> None:
            """Run the job ``job_id`` here when it is due and unleased; nothing otherwise."""
            self.run_job_here(int(job_id))

        @task(name=DISTRIBUTE_TASK, **options)
        def distribute() -> None:
            """Distribute on the tick the message was sent in, and publish a message for each
            claim job enqueued."""
            self.distribute_here(_sent_at(self.distribute.request))

        @task(name=RESCUE_TASK, **options)
        def rescue(hops: int = 0) -> None:
            """Rescue, and publish a message for each job freed or overdue."""
            self.rescue_here(hops=int(hops))

        return run_job, distribute, rescue

    # --- what they do ------------------------------------------------------------------------

    def run_job_here(self, job_id: int) -> JobRun | None:
        """Lease the job ``job_id`` and run it in this process; None when it is leased,
        finished, not due yet, its handler paused or not served here (a duplicate message:
        logged at debug), or when the database's schema is one this process may not work on
        (the job waits for a worker that may)."""
        process = self._here()
        self._take_sigterm(process)
        if process.schema_incompatible is not None:
            log.debug(_log.EXECUTOR_MESSAGE_SKIPPED, job_id=job_id, worker=process.worker_id)
            return None
        try:
            run = self._lease_and_run(process, job_id)
        except DBAPIError as error:
            process.suspect_schema(error)
            raise
        if run is not None:
            self._follow(process, run)
        return run

    def _lease_and_run(self, process: _Process, job_id: int) -> JobRun | None:
        job = lease_job(self.outbox, job_id, process.worker_id, handlers=list(process.handlers))
        if job is None:
            log.debug(_log.EXECUTOR_MESSAGE_SKIPPED, job_id=job_id, worker=process.worker_id)
            # Perhaps dropped for a pause: its handler's due jobs are published when it ends.
            flow = process.runner.flow
            flow.refresh()  # a pause begun this second counts
            process.park(name for name in process.handlers if flow.paused(name))
            return None
        process.hold(job.id)
        try:
            if not process.start_handler(process.handlers[job.handler]):
                # Its object could not start (a sink's downstream is down): as if never leased.
                process.runner.give_back(job, counted=False)
                return None
            run = process.runner.run(job)
        finally:
            process.let_go(job.id)
        if run.outcome == RunOutcome.PAUSED:
            # Given back unattempted, with no message: sent again when the pause ends.
            process.park([job.handler])
        return run

    def _follow(self, process: _Process, run: JobRun) -> None:
        """Publish what a job's run leaves due: a claim job given back with rows waiting, a
        group due again soon, and a capped handler's next batch job."""
        job = run.job
        if run.released:
            self.publish(job.id)
        soon = [
            r for r in run.results if r.due_in is not None and r.due_in <= MAX_COUNTDOWN_SECONDS
        ]
        cap = process.runner.cap(job.handler)
        room = cap is not None and run.outcome == RunOutcome.RAN
        if not soon and not room:
            return
        with self.outbox.engine.connect() as conn:
            later = [(queries.batch_job_of_group(conn, r.group_id), r.due_in) for r in soon]
            following: list[int] = []
            if cap is not None and room:
                # A capped handler's message finds no room while the cap is full, and does
                # nothing: as one of its groups ends, the next due ones (the group a claim
                # left to acquisition among them) get a message each, up to the cap.
                following = queries.overdue_jobs(
                    conn, [job.handler], overdue_seconds=0.0, limit=cap
                )
                if job.kind == schema.JobKind.CLAIM:
                    following.append(job.id)  # given back with rows waiting, or gone
        for job_id, due_in in later:
            if job_id is not None and due_in is not None:
                self.publish(job_id, countdown=due_in + DUE_MARGIN_SECONDS)
        for job_id in following:
            self.publish(job_id)

    def distribute_here(self, sent_at: dt.datetime | None = None) -> int:
        """Distribute for the handlers on the tick the message was sent in (``sent_at``, by
        the beat's clock; None: the tick the database's clock is in now), and publish a
        message for each claim job enqueued; returns how many (none on a schema this process
        may not work on, or on a tick this process took or found taken already).

        Of any number of messages naming one tick (several beats, each sending a few times a
        tick), one distributes: the tick is taken in the database, per handler
        (:func:`outbox.once.distribute_once`, whose ``at`` says which ticks are trusted)."""
        process = self._process
        if process is not None and process.schema_incompatible is not None:
            return 0
        named = None if sent_at is None else tick_of(sent_at, self.distribute_every)
        if named is not None and named in self._recent_ticks:
            return 0
        published = 0
        trusted = True
        for handler in self.outbox.select_handlers(self.handler_names):
            try:
                # Per handler: a buffer table that does not exist holds up its handler only.
                done = once.distribute_once(
                    self.outbox, every=self.distribute_every, handlers=[handler.name], at=sent_at
                )
            except BufferTableMissingError as error:
                for name, table in error.missing.items():
                    log.error(_log.BUFFER_TABLE_MISSING, handler=name, table=table)
                continue
            trusted = trusted and done.tick == named
            if not done.enqueued:
                continue
            with self.outbox.engine.connect() as conn:
                new = queries.newest_due_jobs(
                    conn, [handler.name], kind=schema.JobKind.CLAIM, limit=done.enqueued
                )
            published += self.publish_all(new)
        if named is not None and trusted:
            self._remember_tick(named)
        return published

    def _remember_tick(self, tick: int) -> None:
        """Remember a tick taken (by this process or another) for every handler: its other
        messages here need no statement."""
        self._recent_ticks = [*self._recent_ticks, tick][-RECENT_TICKS:]

    def rescue_here(self, *, hops: int = 0) -> int:
        """Free the jobs of gone workers and expired leases, and publish a message for each
        job freed and each overdue job no message has taken; returns how many.

        In a process not yet allowed to judge another worker gone (a child just started, as
        after a kill: its own heartbeats are not yet steady for ``worker_stale_after``), it
        frees expired leases only, and sends the rescue on (``hops``: how often it was): at
        once, to be taken by another process, then for when this one will be allowed."""
        process = self._here()
        if process.schema_incompatible is not None:
            return 0
        if hops < RESCUE_HOPS and not process.heartbeat.may_judge_others():
            self._send_rescue_on(process, hops)
        freed = process.rescuer.run_once()
        names = self._names(process)
        with self.outbox.engine.connect() as conn:
            ids = (
                queries.newest_due_jobs(conn, names, limit=freed, last_error=queries.RESCUED_ERROR)
                if freed
                else []
            )
            ids += queries.overdue_jobs(
                conn, names, overdue_seconds=OVERDUE_AFTER_SECONDS, limit=SWEEP_LIMIT
            )
        return self.publish_all(dict.fromkeys(ids))

    def _send_rescue_on(self, process: _Process, hops: int) -> None:
        wait = process.heartbeat.judges_in() if hops else 0.0
        if wait is None:  # not steady now: about when it could be, were it back
            wait = self.outbox.settings.worker_stale_after
        try:
            self.rescue.apply_async(
                kwargs={"hops": hops + 1},
                countdown=wait + DUE_MARGIN_SECONDS if wait else None,
                queue=self.queue,
                expires=wait + self.rescue_every * MESSAGE_EXPIRY_PERIODS,
            )
        except Exception as error:  # the broker is down: the next beat's rescue does it
            log.warning(
                _log.EXECUTOR_PUBLISH_FAILED,
                task=RESCUE_TASK,
                error=f"{type(error).__name__}: {error}",
            )

    def publish_rescued(self, freed: int) -> int:
        """Publish a message for each of the ``freed`` jobs a rescue (or a give-back) just
        freed."""
        names = sorted(h.name for h in self.outbox.select_handlers(self.handler_names))
        with self.outbox.engine.connect() as conn:
            ids = queries.newest_due_jobs(
                conn, names, limit=freed, last_error=queries.RESCUED_ERROR
            )
        return self.publish_all(ids)

    def shut_down_node(self) -> None:
        """Ask this process's Celery worker to shut down warm, as ``celery control shutdown``
        does: it takes no more messages, its processes finish what they run, then leave the
        fleet."""
        self.celery.control.shutdown(destination=[self.node])

    def publish(self, job_id: int, *, countdown: float | None = None) -> bool:
        """Send the message that runs the job ``job_id`` (after ``countdown`` seconds); False
        when the broker refused it (logged: the sweep publishes it later)."""
        try:
            self.run_job.apply_async((job_id,), countdown=countdown, queue=self.queue)
        except Exception as error:  # the broker is down: the job waits for the sweep
            log.warning(
                _log.EXECUTOR_PUBLISH_FAILED,
                job_id=job_id,
                error=f"{type(error).__name__}: {error}",
            )
            return False
        return True

    def publish_all(self, job_ids: Iterable[int]) -> int:
        """Publish a message for each job; how many went out."""
        return sum(self.publish(job_id) for job_id in job_ids)

    def _names(self, process: _Process) -> list[str]:
        return sorted(process.handlers)

    # --- one worker process ----------------------------------------------------------------

    def _here(self) -> _Process:
        """This process's registration, made on first use where no signal made it (a solo or
        threads pool, a task called eagerly)."""
        with self._process_lock:
            process = self._process
            if process is None or process.pid != os.getpid():
                process = self._start_process()
            return process

    @property
    def node(self) -> str:
        """The Celery worker's node name (``celery@host`` unless ``--hostname`` says otherwise)."""
        return self._hostname or f"celery@{socket.gethostname()}"

    def _start_process(self) -> _Process:
        worker_id = f"{self.node}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        handlers = {h.name: h for h in self.outbox.select_handlers(self.handler_names)}
        process = _Process(self, worker_id, handlers, slots=self._slots)
        self._process = process
        process.start()
        return process

    def _ours(self) -> bool:
        """Whether the worker running in this process is of this executor's Celery application
        and consumes its queue."""
        from celery import current_app

        if current_app._get_current_object() is not self.celery:
            return False
        queues = self.celery.amqp.queues
        return self.queue in (queues.consume_from or queues)

    def _on_process_init(self, sender: Any = None, **_: Any) -> None:
        """A prefork child starts: a pool of its own, a worker row and a heartbeat, and a
        SIGTERM that gives back its leases."""
        if not self._ours():
            return
        engine = self.outbox._engine
        if engine is not None:
            # The parent's connections are the parent's: this child opens its own, and leaves
            # the inherited ones for the parent to close (closing them here would break its).
            engine.dispose(close=False)
        if isinstance(sender, str):
            self._hostname = sender
        with self._process_lock:
            self._process = None
            self._start_process().child = True

    def _on_process_shutdown(self, **_: Any) -> None:
        """A prefork child exits normally: it leaves the fleet."""
        self._stop_here(give_back=True)

    def _on_worker_ready(self, sender: Any = None, **_: Any) -> None:
        """A worker whose tasks run in its own process (solo, threads) registers at once, so
        that ``outbox status`` shows it before its first job."""
        pool = getattr(sender, "pool", None)
        if pool is None or type(pool).__module__.endswith(".prefork") or not self._ours():
            return
        hostname = getattr(sender, "hostname", None)
        if isinstance(hostname, str):
            self._hostname = hostname
        limit = getattr(pool, "limit", None)
        self._slots = limit if isinstance(limit, int) and limit > 0 else 1
        self._here()

    def _on_worker_shutdown(self, **_: Any) -> None:
        """The worker stops: a process that ran jobs itself (solo, threads) leaves the fleet."""
        self._stop_here(give_back=True)

    def _stop_here(self, *, give_back: bool) -> None:
        process = self._process
        if process is not None and process.pid == os.getpid():
            process.stop(give_back=give_back)

    def _take_sigterm(self, process: _Process) -> None:
        """Handle SIGTERM in this process from now on (once, from the thread that runs tasks:
        the main thread of a prefork child).

        In place of billiard's handler, set in a child after ``worker_process_init``, which
        raises SystemExit in the main thread: a handler running there would take it for its
        own failure, and the child would live on. Left alone where SIGTERM is ignored (the
        worker's ``REMAP_SIGTERM``) or where tasks run in the worker's own process (solo,
        threads: Celery's shutdown is the worker's).
        """
        if process.takes_sigterm or threading.current_thread() is not threading.main_thread():
            return
        process.takes_sigterm = True
        if not process.child or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM in a prefork child (a cold shutdown, the end of a soft shutdown): give back
        the leases it holds, leave the fleet, then die of SIGTERM as it would have.

        The work is done in a thread of its own, waited for at most ``GIVE_BACK_SECONDS``: the
        interrupted main thread may hold a lock (a row, the logging module's) that the work
        would wait for, and it cannot let go while this handler runs.
        """
        worker = threading.Thread(
            target=self._stop_here, kwargs={"give_back": True}, name="outbox-give-back"
        )
        worker.daemon = True
        worker.start()
        worker.join(timeout=GIVE_BACK_SECONDS)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _stamp_sent_at(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """Stamp a distribution message with when it was sent (the beat's clock), which names its
    tick, unless its sender stamped it already."""
    if sender == DISTRIBUTE_TASK and isinstance(headers, dict):
        headers.setdefault(SENT_AT_HEADER, time.time())


def _sent_at(request: Any) -> dt.datetime | None:
    """When a distribution message was sent, from its header; None when it has none (sent
    by an older outbox, called eagerly) or an unreadable one: the task then takes the tick the
    database's clock is in."""
    value = getattr(request, SENT_AT_HEADER, None)
    if value is None:
        headers = getattr(request, "headers", None)
        value = headers.get(SENT_AT_HEADER) if isinstance(headers, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC)
