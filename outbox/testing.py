"""Helpers for the tests of applications that use outbox.

``drain(app)`` runs everything that is due now, synchronously in the calling thread, through
the real code paths: distribution, claims, batch jobs, retries that are already due. Each job
runs through the same runner a worker runs it through (:mod:`outbox._engine.runner`); no
worker is built. Async handlers run on outbox's own event loop thread, as in a worker, so
``drain`` works the same when called from inside a running event loop (an async test, an async
endpoint); it blocks that loop while it runs.

``inline(app)`` does the same by itself as each session's transaction that wrote events
commits, for the length of a ``with`` block (the inline executor,
:mod:`outbox.executors.inline`, exported here). ``assert_enqueued`` and ``assert_not_enqueued``
look at what waits in a buffer.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, cast, overload

from sqlalchemy import ClauseElement, ColumnElement, Connection, Engine, Table, and_, true
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
)
from sqlalchemy.orm import Session, scoped_session

from outbox._core import log as _log
from outbox._db import check_buffer_tables, queries
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.executors.inline import DEFAULT_MAX_ROUNDS as DEFAULT_MAX_ROUNDS
from outbox.executors.inline import Drain
from outbox.executors.inline import DrainResult as DrainResult
from outbox.executors.inline import HandlerFailedError as HandlerFailedError
from outbox.executors.inline import Inline as Inline
from outbox.executors.inline import inline as inline
from outbox.handler import Handler

log = _log.get_logger(__name__)


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
    draining = Drain(app, app.select_handlers(handlers), log)
    check_buffer_tables(app.engine, {name: h.tables for name, h in draining.handlers.items()})
    draining.start_handlers()
    try:
        return draining.run(max_rounds)
    finally:
        draining.throughput.run_once()
        draining.stop_handlers()


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
