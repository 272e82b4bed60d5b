"""Helpers for the tests of applications that use outbox.

``drain(app)`` runs everything that is due now, synchronously in the calling thread, through
the real code paths: distribution, claims, batch jobs, retries that are already due. Each job
runs through the same runner a worker runs it through (:mod:`outbox._engine.runner`); no
worker is built. Async handlers run on outbox's own event loop thread, as in a worker, so
``drain`` works the same when called from inside a running event loop (an async test, an async
endpoint); it blocks that loop while it runs.

``inline(app)`` does the same by itself as each session's transaction that wrote events
commits, for the length of a ``with`` block. ``assert_enqueued`` and ``assert_not_enqueued``
look at what waits in a buffer.
"""

from __future__ import annotations

import datetime as dt
import threading
import types
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

from sqlalchemy import ClauseElement, ColumnElement, Connection, Engine, Table, and_, event, true
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
)
from sqlalchemy.orm import ORMExecuteState, Session, SessionTransaction, scoped_session

from outbox import lifecycle
from outbox._core import log as _log
from outbox._core.faults import AFTER_ACQUIRE, crash_point
from outbox._db import check_buffer_tables, queries
from outbox._engine import acquisition, distributor
from outbox._engine.flow_state import FlowState
from outbox._engine.runner import FLOW_STATE_REFRESH_SECONDS, Runner, new_worker_id
from outbox._engine.stats import WorkerStats
from outbox._services.outage import Outage
from outbox._services.rescuer import Rescuer
from outbox._services.throughput import Throughput
from outbox.app import Handler, Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import BufferTableMissingError, OutboxError
from outbox.results import DEAD, REFUSED, RETRYING, BatchResult

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

    def __init__(
        self,
        app: Outbox,
        handlers: list[Handler[Any]],
        on_result: Callable[[BatchResult], None] | None = None,
    ) -> None:
        self.app = app
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
            log.error(_log.BUFFER_TABLE_MISSING, worker=self.id, handler=name, table=table)

    def start_handlers(self) -> None:
        """Each handler object's ``outbox_start``; what one raises stops the drain here, the
        handlers started before it stopped again."""
        lifecycle.start_all(self.app, self.handlers.values(), log, worker=self.id)

    def stop_handlers(self) -> None:
        """Each handler object's ``outbox_stop``, once; what one raises is logged."""
        lifecycle.stop_all(self.handlers.values(), log, worker=self.id)


# --- the inline executor -------------------------------------------------------------------------

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
        self._started: _Drain | None = None
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
        started = _Drain(self.app, self.handlers)
        check_buffer_tables(self.app.engine, {h.name: h.table for h in self.handlers})
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
        draining = _Drain(self.app, self.handlers, on_result=self._record)
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


# --- assertions on what waits in a buffer --------------------------------------------------------

SHOWN_ROWS = 5
"""How many rows a failed assertion shows."""
_SHOWN_VALUE_CHARS = 40

SyncTarget = Outbox | Engine | Connection | Session | scoped_session[Any]
"""Where :func:`assert_enqueued` looks: the application's database, or a connection or session
(whose own transaction's writes count)."""
AsyncTarget = AsyncEngine | AsyncConnection | AsyncSession | async_scoped_session[Any]
"""The async targets of :func:`assert_enqueued`: the call returns a coroutine to await."""
Subject = type[Any] | Handler[Any] | str
"""A buffer model, a handler, or a handler's name (with an ``Outbox`` as the target)."""
Where = Mapping[str, object] | ColumnElement[bool] | None
"""Which events count: column values by column key (``{"order_id": 7}``, ``None`` for NULL),
or a SQLAlchemy condition on the buffer's table (``Model.amount > 10``)."""


@overload
def assert_enqueued(
    target: SyncTarget, subject: Subject, *, count: int | None = None, where: Where = None
) -> None: ...


@overload
def assert_enqueued(
    target: AsyncTarget, subject: Subject, *, count: int | None = None, where: Where = None
) -> Coroutine[Any, Any, None]: ...


def assert_enqueued(
    target: SyncTarget | AsyncTarget,
    subject: Subject,
    *,
    count: int | None = None,
    where: Where = None,
) -> Coroutine[Any, Any, None] | None:
    """Assert that events wait in a buffer (unclaimed, or claimed and not yet handled):
    ``count`` of them exactly, or at least one when ``count`` is None; ``where``: only those
    with these column values, or meeting this condition. The failure message shows how many
    wait and the first few rows.

    ``target``: an ``Outbox`` or an ``Engine`` (what is committed), or a ``Connection`` or
    ``Session`` (what its transaction sees, its own uncommitted events too; a session's pending
    objects are flushed first when it autoflushes). With an ``AsyncSession``, an
    ``AsyncConnection`` or an ``AsyncEngine``, await the call. ``subject``: the buffer model, a
    ``Handler``, or a handler's name when ``target`` is the ``Outbox``.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise TypeError(f"count must be an int or None, got {count!r}")
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    table, label = _buffer_of(target, subject)
    condition = _condition(table, where)
    described = _where_text(where)

    def check(conn: Connection | Session) -> None:
        found, rows = queries.waiting_rows(conn, table, condition, SHOWN_ROWS)
        if found and (count is None or count == found):
            return
        expected = "at least 1 event" if count is None else f"{count} event(s)"
        if count is not None and found > count:
            raise AssertionError(
                f"expected {expected} waiting in {label}{described}, found {found}; the first:"
                f"{_rows_text(rows)}"
            )
        total, waiting = queries.waiting_rows(conn, table, None, SHOWN_ROWS)
        message = f"expected {expected} waiting in {label}{described}, found {found}"
        if condition is not None or not total:
            message += f"; {total} waiting in all"
        raise AssertionError(message + (f"; the first:{_rows_text(waiting)}" if total else ""))

    return _run_check(target, check)


@overload
def assert_not_enqueued(target: SyncTarget, subject: Subject, *, where: Where = None) -> None: ...


@overload
def assert_not_enqueued(
    target: AsyncTarget, subject: Subject, *, where: Where = None
) -> Coroutine[Any, Any, None]: ...


def assert_not_enqueued(
    target: SyncTarget | AsyncTarget, subject: Subject, *, where: Where = None
) -> Coroutine[Any, Any, None] | None:
    """Assert that no event waits in a buffer (``where``: none with these column values, or
    meeting this condition); the failure message shows how many wait and the first few. The
    targets and subjects of :func:`assert_enqueued`; await it with an async target."""
    table, label = _buffer_of(target, subject)
    condition = _condition(table, where)
    described = _where_text(where)

    def check(conn: Connection | Session) -> None:
        found, rows = queries.waiting_rows(conn, table, condition, SHOWN_ROWS)
        if found:
            raise AssertionError(
                f"expected no event waiting in {label}{described}, found {found}; the first:"
                f"{_rows_text(rows)}"
            )

    return _run_check(target, check)


def _run_check(
    target: SyncTarget | AsyncTarget, check: Callable[[Connection | Session], None]
) -> Coroutine[Any, Any, None] | None:
    """Run ``check`` where ``target`` sees the buffer; a coroutine for an async target."""
    if isinstance(target, async_scoped_session):
        return _run_async_check(cast(AsyncSession, target()), check)
    if isinstance(target, AsyncEngine | AsyncConnection | AsyncSession):
        return _run_async_check(target, check)
    if isinstance(target, scoped_session):
        target = cast(Session, target())
    if isinstance(target, Session):
        if target.autoflush:
            target.flush()
        check(target)
    elif isinstance(target, Connection):
        check(target)
    else:
        engine: Engine = target.engine
        with engine.connect() as conn:
            check(conn)
    return None


async def _run_async_check(
    target: AsyncEngine | AsyncConnection | AsyncSession,
    check: Callable[[Connection | Session], None],
) -> None:
    def run(sync: Session | Connection) -> None:
        if isinstance(sync, Session) and sync.autoflush:
            sync.flush()
        check(sync)

    if isinstance(target, AsyncEngine):
        async with target.connect() as conn:
            await conn.run_sync(run)
    else:
        await target.run_sync(run)


_TARGETS = "an Outbox, an Engine, a Connection, a Session or their async kinds"


def _buffer_of(target: object, subject: object) -> tuple[Table, str]:
    """The buffer table ``subject`` names, and how a message names it; bad input refused."""
    if not isinstance(target, (Outbox, Engine, Connection, Session, scoped_session)) and not (
        isinstance(target, (AsyncEngine, AsyncConnection, AsyncSession, async_scoped_session))
    ):
        raise TypeError(f"the target must be {_TARGETS}, got {type(target).__name__}")
    if isinstance(subject, str):
        if not isinstance(target, Outbox):
            raise TypeError(
                f"a handler's name ({subject!r}) needs the Outbox as the target; "
                "pass the buffer model or the Handler"
            )
        handler = target.get_handler(subject)
        return handler.table, f"{handler.table.name} (handler {handler.name!r})"
    if isinstance(subject, Handler):
        return subject.table, f"{subject.table.name} (handler {subject.name!r})"
    if isinstance(subject, type) and issubclass(subject, BufferMixin):
        table = subject.__table__  # type: ignore[attr-defined]
        return cast(Table, table), cast(Table, table).name
    raise TypeError(
        f"subject must be a buffer model, a Handler or a handler's name, got {subject!r}"
    )


def _condition(table: Table, where: object) -> ColumnElement[bool] | None:
    if where is None:
        return None
    if isinstance(where, ColumnElement):
        return where
    if not isinstance(where, Mapping):
        raise TypeError(
            f"where must be a mapping of column values or a SQLAlchemy condition, got {where!r}"
        )
    conditions: list[ColumnElement[bool]] = []
    for key, value in where.items():
        if key not in table.c:
            known = ", ".join(table.c.keys())
            raise ValueError(f"{table.name} has no column {key!r}; its columns: {known}")
        column = table.c[key]
        conditions.append(column.is_(None) if value is None else column == value)
    return and_(true(), *conditions)


def _where_text(where: object) -> str:
    if where is None:
        return ""
    if isinstance(where, Mapping):
        return " where " + ", ".join(f"{k} = {v!r}" for k, v in where.items())
    try:
        text = str(cast(ClauseElement, where).compile(compile_kwargs={"literal_binds": True}))
    except Exception:  # a value with no literal form: the condition with its parameters named
        text = str(where)
    return f" where {text}"


def _rows_text(rows: Sequence[Any]) -> str:
    lines = []
    for row in rows:
        values = dict(row._mapping)
        # The id first, where the eye looks for it; then the columns in the table's order.
        ordered = {"id": values.pop("id", None), **values}
        lines.append("\n  " + ", ".join(f"{k}={_short(v)}" for k, v in ordered.items()))
    return "".join(lines)


def _short(value: object) -> str:
    text = str(value) if isinstance(value, dt.datetime | uuid.UUID) else repr(value)
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[: _SHOWN_VALUE_CHARS - 3] + "..."
