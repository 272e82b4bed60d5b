"""One Celery worker process running outbox's jobs (a prefork child, or a solo or threads
worker): its row in ``outbox_workers`` and the heartbeat thread that keeps it, the job runner,
the jobs it runs now, the paused handlers whose jobs it publishes once their pause ends, and
how it leaves the fleet."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.exc import DBAPIError

from outbox import lifecycle, schema
from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import is_transient
from outbox._engine.runner import Runner
from outbox._services.heartbeat import Heartbeat, heartbeat_interval
from outbox._services.outage import Outage
from outbox._services.rescuer import Rescuer
from outbox._services.schema_watch import SchemaWatch
from outbox._services.throughput import Throughput
from outbox.app import Outbox
from outbox.exceptions import SchemaIncompatibleError
from outbox.executors.celery.messages import SWEEP_LIMIT
from outbox.handler import Handler

# Every module of the executor logs under the package's logger: the name an application
# configures.
log = _log.get_logger("outbox.executors.celery")

STOP_JOIN_SECONDS = 5.0
"""How long a stopping process waits for its heartbeat thread to end."""


class Executor(Protocol):
    """What a worker process asks of the executor that started it
    (:class:`outbox.executors.celery.CeleryExecutor`)."""

    outbox: Outbox
    queue: str
    distribute_every: float

    def publish_all(self, job_ids: Iterable[int]) -> int:
        """Publish a message for each job; how many went out."""
        ...

    def publish_rescued(self, freed: int) -> int:
        """Publish a message for each of the ``freed`` jobs a give-back just freed."""
        ...

    def shut_down_node(self) -> None:
        """Ask this process's Celery worker to shut down warm."""
        ...


@dataclass
class WorkerProcess:
    """What one worker process (a prefork child, or a solo worker) holds: its worker row's id,
    its heartbeat, the job runner, and the jobs it runs now."""

    executor: Executor
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
            heard=self.heartbeat.heard,
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
