"""The inline executor: a test's events handled in its own process as the transaction that
wrote them commits (:func:`inline`, which users import from :mod:`outbox.testing`), and the
drain it runs them with.

A drain runs everything that is due now, synchronously in the calling thread, through the real
code paths: distribution, claims, batch jobs, retries that are already due. Each job runs
through the same runner a worker runs it through (:mod:`outbox._engine.runner`); no worker is
built. :func:`outbox.testing.drain` is one drain; :func:`inline` runs one after each commit
that wrote events.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import ORMExecuteState, Session, SessionTransaction

from outbox import lifecycle
from outbox._core import log as _log
from outbox._core.faults import AFTER_ACQUIRE, crash_point
from outbox._db import check_buffer_tables
from outbox._engine import acquisition, distributor
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner, new_worker_id
from outbox._engine.stats import WorkerStats
from outbox._services.outage import Outage
from outbox._services.rescuer import Rescuer
from outbox._services.throughput import Throughput
from outbox.app import Outbox
from outbox.exceptions import BufferTableMissingError, OutboxError
from outbox.handler import Handler
from outbox.results import DEAD, REFUSED, RETRYING, BatchResult

# Its lines are outbox.testing's, as drain's are: the helpers a test suite uses log as one.
log = _log.get_logger("outbox.testing")

DEFAULT_MAX_ROUNDS = 10_000


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain did."""

    jobs: int
    stats: WorkerStats


class Drain:
    """One drain: a runner, and what a worker's loop would keep around it, in one thread.

    ``log``: the caller's logger, which its lines keep (``outbox.testing`` for
    :func:`outbox.testing.drain`)."""

    def __init__(
        self,
        app: Outbox,
        handlers: list[Handler[Any]],
        log: _log.Logger,
        on_result: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.app = app
        self.log = log
        self.id = new_worker_id()
        self.handlers = {h.name: h for h in handlers}
        self.stats = WorkerStats()
        self.flow = FlowState(app, refresh_every=FLOW_STATE_REFRESH_SECONDS)
        self.throughput = Throughput(app)
        self.set_aside: dict[str, str] = {}
        """Handlers whose buffer table was found missing, with the table: not served."""
        self._outage = Outage(self.id, log)
        """Said once per drain: a drain never says the database is back."""
        self.runner = Runner(
            app,
            worker_id=self.id,
            handlers=self.handlers,
            flow=self.flow,
            stats=self.stats,
            claims_in_flight=1,
            throughput=self.throughput,
            set_aside=self._set_aside,
            database_error=self._outage.report,
            on_result=on_result,
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
            self.log.error(_log.BUFFER_TABLE_MISSING, worker=self.id, handler=name, table=table)

    def start_handlers(self) -> None:
        """Each handler object's ``outbox_start``; what one raises stops the drain here, the
        handlers started before it stopped again."""
        lifecycle.start_all(self.app, self.handlers.values(), self.log, worker=self.id)

    def stop_handlers(self) -> None:
        """Each handler object's ``outbox_stop``, once; what one raises is logged."""
        lifecycle.stop_all(self.handlers.values(), self.log, worker=self.id)


_WRITTEN = "outbox.testing.inline.written"
"""``Session.info`` key: the handlers whose buffers the session's transaction wrote to."""
_COMMITTED = "outbox.testing.inline.committed"
"""``Session.info`` key: those handlers, once the transaction committed (run when it ends)."""
_FAILED = (RETRYING, DEAD, REFUSED)


class HandlerFailedError(OutboxError, AssertionError):
    """Handlers failed while :func:`inline` ran them: each group's outcome is recorded as in
    production (retrying, dead, held); this says so, with the handler's error, at the end of the
    ``with`` block, at :meth:`Inline.check` or at :meth:`Inline.drain`.

    ``results``: the failed batches (``outbox.results.BatchResult``), in the order they ran.
    """

    def __init__(self, results: Sequence[BatchResult]) -> None:
        self.results = tuple(results)
        lines = [f"{len(self.results)} group(s) failed while handled inline:"]
        for result in self.results:
            lines.append(
                f"- handler {result.handler!r}, group {result.group_id}, attempt "
                f"{result.attempt}: {result.outcome}\n{_indented(result.error or '')}"
            )
        super().__init__("\n".join(lines))


class Inline:
    """Runs the events of an application's handlers in the calling process as the writing
    transaction commits: see :func:`inline`. Use it as a context manager."""

    def __init__(
        self,
        app: Outbox,
        *,
        handlers: tuple[str, ...] | list[str] = (),
        raise_errors: bool = True,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ) -> None:
        if not isinstance(app, Outbox):
            raise TypeError(f"inline takes an Outbox, got {type(app).__name__}")
        if isinstance(handlers, str):
            raise TypeError(f"handlers is a list of handler names, got the text {handlers!r}")
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.app = app
        self.handlers = app.select_handlers(handlers)
        self.handler_names = [h.name for h in self.handlers]
        self.raise_errors = raise_errors
        self.max_rounds = max_rounds
        self.results: list[BatchResult] = []
        """Every batch result since the block began, in the order they ran."""
        self._raised = 0
        """How many of :attr:`failures` were raised already."""
        self._started: Drain | None = None
        """What started the handler objects, and stops them at the block's end; None outside
        the block."""
        self._lock = threading.Lock()
        self._results_lock = threading.Lock()
        self._draining = False
        self._pending = False

    # --- the block -------------------------------------------------------------------------

    def __enter__(self) -> Inline:
        if self._started is not None:
            raise RuntimeError("this inline executor is running already")
        started = Drain(self.app, self.handlers, log)
        check_buffer_tables(self.app.engine, {h.name: h.tables for h in self.handlers})
        started.start_handlers()
        self._started = started
        self._tables = {h.table: h.name for h in self.handlers}
        for name, listener in self._listeners():
            event.listen(Session, name, listener)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        for name, listener in self._listeners():
            event.remove(Session, name, listener)
        started, self._started = self._started, None
        if started is not None:
            started.stop_handlers()
        if error is None:
            self.check()

    def _listeners(self) -> list[tuple[str, Callable[..., None]]]:
        return [
            ("after_flush", self._after_flush),
            ("do_orm_execute", self._do_orm_execute),
            ("after_commit", self._after_commit),
            ("after_transaction_end", self._after_transaction_end),
        ]

    # --- what a test calls -------------------------------------------------------------------

    @property
    def failures(self) -> list[BatchResult]:
        """The batches whose handler failed (or whose outcome the database refused), in order."""
        with self._results_lock:
            return [r for r in self.results if r.outcome in _FAILED and r.error is not None]

    def drain(self) -> DrainResult:
        """Run what is due now, as :func:`drain` does (events written outside a session, through
        a Core ``Connection``, wait for this); raises :class:`HandlerFailedError` for failures
        not raised yet, unless ``raise_errors`` is False."""
        self._running()
        result = self._run()
        self.check()
        return result

    def check(self) -> None:
        """Raise :class:`HandlerFailedError` for the failures not raised yet (nothing when
        ``raise_errors`` is False)."""
        if not self.raise_errors:
            return
        failures = self.failures
        new, self._raised = failures[self._raised :], len(failures)
        if new:
            raise HandlerFailedError(new)

    # --- how commits are followed ------------------------------------------------------------

    def _running(self) -> None:
        if self._started is None:
            raise RuntimeError("the inline executor runs inside its with block only")

    def _record(self, result: BatchResult) -> None:
        with self._results_lock:
            self.results.append(result)

    def _note(self, session: Session, tables: Iterable[object]) -> None:
        names = {self._tables[t] for t in tables if t in self._tables}
        if names:
            session.info.setdefault(_WRITTEN, set()).update(names)

    def _after_flush(self, session: Session, context: object) -> None:
        self._note(session, (sa_inspect(obj).mapper.local_table for obj in session.new))

    def _do_orm_execute(self, state: ORMExecuteState) -> None:
        if state.is_insert:
            self._note(state.session, [getattr(state.statement, "table", None)])

    def _after_commit(self, session: Session) -> None:
        # A savepoint's release commits nothing yet: its rows wait for the outermost commit.
        if session.get_nested_transaction() is None and _WRITTEN in session.info:
            session.info[_COMMITTED] = session.info.pop(_WRITTEN)

    def _after_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        # Run once the outermost transaction is over and its connection is back in the pool:
        # the session is whole again whatever the run does, and SQLite's lock is free.
        if transaction.parent is not None:
            return
        session.info.pop(_WRITTEN, None)
        if session.info.pop(_COMMITTED, None) and self._started is not None:
            self._run()

    def _run(self) -> DrainResult:
        """Run what is due; a commit made while a run is under way (a handler that writes
        events, another thread) is run by that run before it returns."""
        self._running()
        with self._lock:
            self._pending = True
            if self._draining:
                return DrainResult(0, WorkerStats())
            self._draining = True
        # A drain of its own for each run, through the runner every executor runs jobs with:
        # it reads pauses and breakers afresh, as a test that pauses or resumes a handler
        # between commits expects; the handler objects stay started by the block.
        draining = Drain(self.app, self.handlers, log, on_result=self._record)
        jobs = 0
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        self._draining = False
                        break
                    self._pending = False
                jobs += draining.run(self.max_rounds).jobs
        except BaseException:
            with self._lock:
                self._draining = self._pending = False
            raise
        finally:
            draining.throughput.run_once()
        return DrainResult(jobs, draining.stats)


def inline(
    app: Outbox,
    *,
    handlers: tuple[str, ...] | list[str] = (),
    raise_errors: bool = True,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> Inline:
    """Handle the events of ``app``'s handlers in this process when the transaction that wrote
    them commits, through the real code paths (distribution, claim, batch job, completion), so
    that a test needs no worker and no broker. A context manager::

        with outbox.testing.inline(app) as runner:
            session.add(OrderEvent(order_id=1))
            session.commit()  # the handler has run when commit() returns

    Followed: commits of every ``Session`` and ``AsyncSession`` that wrote rows of the
    handlers' buffers (``session.add``, ``add_events``, ``session.execute(insert(...))``) while
    the block runs; a savepoint waits for the outermost commit, a rollback runs nothing.
    Events written through a Core ``Connection`` wait for :meth:`Inline.drain`. ``handlers``:
    the names to run (all when empty). Handler objects are started at the start of the block
    and stopped at its end, as a worker does.

    What is due now runs; retries scheduled for later wait, as with :func:`drain` (a
    ``RetryPolicy`` without delays makes them due at once). A handler that raises has its
    group's outcome recorded as in production (retrying, or dead after its attempts), and the
    commit returns normally, as the writer's commit does in production; the failure is raised
    as :class:`HandlerFailedError`, with the handler's error, at the end of the block (or at
    :meth:`Inline.check` or :meth:`Inline.drain`). ``raise_errors=False``: nothing is raised,
    for tests of what failures do; :attr:`Inline.failures` and :attr:`Inline.results` say what
    happened. Async handlers run on outbox's own event loop thread, so a commit inside a
    running event loop (an async test, an endpoint) works the same, and blocks that loop while
    the handlers run.
    """
    return Inline(app, handlers=handlers, raise_errors=raise_errors, max_rounds=max_rounds)


def _indented(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.rstrip().splitlines())
