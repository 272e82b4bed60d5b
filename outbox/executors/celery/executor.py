"""outbox installed on a Celery application: :func:`install`, and the
:class:`CeleryExecutor` it returns, whose three tasks lease and run jobs, distribute and
rescue, and which follows the worker processes through Celery's signals (see
:mod:`outbox.executors.celery`)."""

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
from types import FrameType
from typing import Any

from celery import Celery, signals
from sqlalchemy.exc import DBAPIError

from outbox import once, schema
from outbox._core import log as _log
from outbox._db import queries
from outbox._engine.distributor import MAX_TICK_SECONDS, MIN_TICK_SECONDS, tick_of
from outbox._engine.runner import JobRun, RunOutcome, lease_job
from outbox._services import retention
from outbox._services.heartbeat import heartbeat_interval
from outbox.app import Outbox
from outbox.exceptions import BufferTableMissingError
from outbox.executors.celery.messages import (
    BEAT_SENDS_PER_TICK,
    DEFAULT_DISTRIBUTE_EVERY_SECONDS,
    DEFAULT_QUEUE,
    DISTRIBUTE_TASK,
    DUE_MARGIN_SECONDS,
    MAX_COUNTDOWN_SECONDS,
    MESSAGE_EXPIRY_PERIODS,
    OVERDUE_AFTER_SECONDS,
    RESCUE_TASK,
    RUN_JOB_TASK,
    SWEEP_LIMIT,
    sent_at,
    stamp_sent_at,
)
from outbox.executors.celery.process import WorkerProcess

# Every module of the executor logs under the package's logger: the name an application
# configures.
log = _log.get_logger("outbox.executors.celery")

RECENT_TICKS = 16
"""Ticks a process remembers having taken or found taken, so that the other messages of one
tick cost it no statement."""
RESCUE_HOPS = 3
"""How many times a rescue that ran in a process not yet allowed to judge another worker gone
sends itself on (at once, then when the process will be allowed)."""
GIVE_BACK_SECONDS = 5.0
"""How long a child stopped by SIGTERM spends giving back its leases before it exits anyway
(the rescue frees them then, once its heartbeat is silent)."""

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
        self._process: WorkerProcess | None = None
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
        signals.before_task_publish.connect(stamp_sent_at, weak=False)
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
            self.distribute_here(sent_at(self.distribute.request))

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

    def _lease_and_run(self, process: WorkerProcess, job_id: int) -> JobRun | None:
        leased_at = time.monotonic()
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
            run = process.runner.run(job, leased_at)
        finally:
            process.let_go(job.id)
        if run.outcome == RunOutcome.PAUSED:
            # Given back unattempted, with no message: sent again when the pause ends.
            process.park([job.handler])
        return run

    def _follow(self, process: WorkerProcess, run: JobRun) -> None:
        """Publish what a job's run leaves due: a claim job given back with rows waiting, a
        group due again soon, and a capped handler's next batch job."""
        job = run.job
        if run.released:
            self.publish(job.id)
        # Groups given back because their leases may be lost: no message names them otherwise
        # until the rescue's sweep. Sent a heartbeat later, so that a process the fleet has
        # not heard from does not take them straight back.
        for returned in run.returned:
            self.publish(returned, countdown=heartbeat_interval(self.outbox.settings))
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
        (:func:`outbox.once.distribute_once`, whose ``at`` says which ticks are trusted).
        Then a pass of the archive's retention, at most every ten minutes in a process."""
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
        # No `outbox work` leads a Celery fleet: the archive's days ahead, and its retention.
        retention.pass_if_due(self.outbox)
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

    def _send_rescue_on(self, process: WorkerProcess, hops: int) -> None:
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

    def _names(self, process: WorkerProcess) -> list[str]:
        return sorted(process.handlers)

    # --- one worker process ----------------------------------------------------------------

    def _here(self) -> WorkerProcess:
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

    def _start_process(self) -> WorkerProcess:
        worker_id = f"{self.node}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        handlers = {h.name: h for h in self.outbox.select_handlers(self.handler_names)}
        process = WorkerProcess(self, worker_id, handlers, slots=self._slots)
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

    def _take_sigterm(self, process: WorkerProcess) -> None:
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
