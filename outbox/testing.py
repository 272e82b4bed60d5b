"""Helpers for the tests of applications that use outbox.

``drain(app)`` runs everything that is due now, synchronously in the calling thread, through
the real code paths: distribution, claims, batch jobs, retries that are already due. Each job
runs through the same runner a worker runs it through (:mod:`outbox._engine.runner`); no
worker is built. Async handlers run on outbox's own event loop thread, as in a worker, so
``drain`` works the same when called from inside a running event loop (an async test, an async
endpoint); it blocks that loop while it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from outbox import _log, lifecycle
from outbox._db import check_buffer_tables
from outbox._db.dialects import error_summary
from outbox._engine import acquisition, distributor
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner, new_worker_id
from outbox._engine.stats import WorkerStats
from outbox._faults import AFTER_ACQUIRE, crash_point
from outbox._services.rescuer import Rescuer
from outbox._services.throughput import Throughput
from outbox.app import Handler, Outbox
from outbox.exceptions import BufferTableMissingError

log = _log.get_logger(__name__)

DEFAULT_MAX_ROUNDS = 10_000


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain did."""

    jobs: int
    stats: WorkerStats


def drain(
    app: Outbox,
    *,
    handlers: tuple[str, ...] | list[str] = (),
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> DrainResult:
    """Distribute, claim and handle until nothing is due now; returns what was done.

    Retries scheduled for later are left for later: a test that wants them sooner gives the
    handler a ``RetryPolicy`` with short delays. Handler objects are started and stopped around
    the drain as a worker starts and stops them (:mod:`outbox.lifecycle`): a ready-made sink
    connects and checks its downstream first, and closes its connections at the end. Raises
    ``RuntimeError`` after ``max_rounds`` rounds, which means a handler keeps producing work,
    and ``BufferTableMissingError`` when a handler's buffer table does not exist.
    """
    draining = _Drain(app, app.select_handlers(handlers))
    check_buffer_tables(app.engine, {name: h.table for name, h in draining.handlers.items()})
    draining.start_handlers()
    try:
        return draining.run(max_rounds)
    finally:
        draining.throughput.run_once()
        draining.stop_handlers()


class _Drain:
    """One drain: a runner, and what a worker's loop would keep around it, in one thread."""

    def __init__(self, app: Outbox, handlers: list[Handler[Any]]) -> None:
        self.app = app
        self.id = new_worker_id()
        self.handlers = {h.name: h for h in handlers}
        self.stats = WorkerStats()
        self.flow = FlowState(app, refresh_every=FLOW_STATE_REFRESH_SECONDS)
        self.throughput = Throughput(app)
        self.set_aside: dict[str, str] = {}
        """Handlers whose buffer table was found missing, with the table: not served."""
        self._database_down = False
        self.runner = Runner(
            app,
            worker_id=self.id,
            handlers=self.handlers,
            flow=self.flow,
            stats=self.stats,
            claims_in_flight=1,
            throughput=self.throughput,
            set_aside=self._set_aside,
            database_error=self._report_database_error,
        )
        self.rescuer = Rescuer(app, self.id)

    def run(self, max_rounds: int) -> DrainResult:
        jobs = 0
        for _ in range(max_rounds):
            ran = self.run_once()
            jobs += ran
            if ran:
                continue
            self.rescuer.run_once()
            if not distributor.enqueued(distributor.run_once(self.app, list(self.handlers))):
                if not self.run_once():
                    return DrainResult(jobs, self.stats)
                jobs += 1
        raise RuntimeError(f"drain did not finish within {max_rounds} rounds")

    def run_once(self) -> int:
        """Lease one due job and run it; how many ran. A job that found its buffer table
        missing is given back untouched and its handler set aside; BufferTableMissingError
        then names the table."""
        known = set(self.set_aside)
        self.flow.refresh_if_due()
        serving = [name for name in self.handlers if name not in self.set_aside]
        jobs = acquisition.acquire(
            self.app,
            worker_id=self.id,
            serving=serving,
            handlers=list(self.handlers),
            cap=self.runner.cap,
            probing=self.flow.probing,
            limit=1,
        )
        if jobs:
            crash_point(AFTER_ACQUIRE)
        for job in jobs:
            self.runner.run(job)
        found = {h: t for h, t in self.set_aside.items() if h not in known}
        if found:
            raise BufferTableMissingError(found)
        return len(jobs)

    def _set_aside(self, missing: Mapping[str, str]) -> None:
        found = {h: t for h, t in missing.items() if h not in self.set_aside}
        self.set_aside.update(found)
        for name, table in found.items():
            log.error(_log.BUFFER_TABLE_MISSING, worker=self.id, handler=name, table=table)

    def _report_database_error(self, error: DBAPIError) -> None:
        # Once per drain, not once per group.
        if not self._database_down:
            self._database_down = True
            log.warning(_log.WORKER_DATABASE_ERROR, worker=self.id, error=error_summary(error))

    def start_handlers(self) -> None:
        """Each handler object's ``outbox_start``; what one raises stops the drain here, the
        handlers started before it stopped again."""
        started: list[Handler[Any]] = []
        try:
            for handler in self.handlers.values():
                lifecycle.start(self.app, handler)
                started.append(handler)
        except BaseException:
            self.stop_handlers(started)
            raise

    def stop_handlers(self, handlers: list[Handler[Any]] | None = None) -> None:
        """Each handler object's ``outbox_stop``, once; what one raises is logged."""
        for handler in self.handlers.values() if handlers is None else handlers:
            if isinstance(handler.func, lifecycle.Stops):
                try:
                    lifecycle.stop(handler)
                except Exception as error:
                    log.warning(
                        _log.HANDLER_STOP_FAILED,
                        worker=self.id,
                        handler=handler.name,
                        error=f"{type(error).__name__}: {error}",
                    )
