"""A run-once caller (:func:`outbox.once.work_once`) while it works: registered in
``outbox_workers`` and heartbeating, so that ``outbox status`` lists it and the leases of the
jobs it runs are kept; leasing one due job at a time and running it through the runner a
worker runs it through (:mod:`outbox._engine.runner`); counting what the groups came to.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.exc import DBAPIError

from outbox import lifecycle, schema
from outbox._core import log as _log
from outbox._core.faults import AFTER_ACQUIRE, crash_point
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import error_summary
from outbox._engine import acquisition
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner
from outbox._once.results import Stopped
from outbox._services.heartbeat import Heartbeat, heartbeat_interval
from outbox._services.throughput import Throughput
from outbox.app import Outbox
from outbox.exceptions import BufferTableMissingError
from outbox.handler import Handler
from outbox.results import BatchResult, Outcome


def caller_id() -> str:
    """A run-once caller's id: like a worker's, with the prefix that keeps it from leading."""
    return f"{queries.RUN_ONCE_PREFIX}{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Counts:
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
def handlers_started(app: Outbox, handlers: list[Handler[Any]], log: _log.Logger) -> Iterator[None]:
    """The handler objects started (each ``outbox_start``), and stopped after, as a worker
    starts and stops them; what a stop raises is logged on ``log``."""
    lifecycle.start_all(app, handlers, log)
    try:
        yield
    finally:
        lifecycle.stop_all(handlers, log)


class Caller:
    """One run-once caller while it works: its id, the jobs it holds, its heartbeat. ``log``:
    the caller's logger (``outbox.once``'s), which its lines keep."""

    def __init__(self, app: Outbox, log: _log.Logger) -> None:
        self.app = app
        self.log = log
        self.id = caller_id()
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
                self.log.warning(
                    _log.WORKER_DATABASE_ERROR, worker=self.id, error=error_summary(error)
                )
                continue
            if asked is not None and not self.asked.is_set():
                # Drain or stop alike: a run holds one job, which finishes either way.
                self.log.info(
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
                self.log.error(_log.BUFFER_TABLE_MISSING, worker=self.id, handler=name, table=table)

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
            heard=self.heartbeat.heard,
        )
        try:
            while (stopped := why_stop()) is None:
                if not self.heartbeat.heard():
                    stopped = Stopped.UNHEARD
                    break
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
        self.log.warning(_log.WORKER_DATABASE_ERROR, worker=self.id, error=error_summary(error))


@contextmanager
def registered(app: Outbox, log: _log.Logger) -> Iterator[Caller]:
    """A caller registered in ``outbox_workers`` and heartbeating while it works; its row is
    deleted at the end."""
    caller = Caller(app, log)
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
            # Left behind, it is forgotten by a later run's rescue (outbox.once.rescue_once); what
            # raised, if anything, goes on up.
            log.warning(_log.WORKER_DATABASE_ERROR, worker=caller.id, error=error_summary(error))
