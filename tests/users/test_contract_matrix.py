"""The public contract over what users bring: handler kinds, session kinds and database targets.

Every committed event is handed to its handler with its values as ``session.get`` loads them,
a failed attempt is retried, and an event of a rolled-back transaction is never handed over;
for every kind of handler (``tests.handler_kinds``), every way of writing events (ORM or Core,
sync or async), on SQLite, on PostgreSQL, and on PostgreSQL through a transaction-mode
PgBouncer. The cases are generated pairwise: every pair of choices from two of the three
dimensions meets in at least one case, which takes as many cases as the largest pair of
dimensions (handler kinds x session kinds) instead of their full product.

Flow control gets a matrix of its own: every kind of handler with every flow-control option
(deferrals whole and in part, keyed, ordered, rate-limited, bisected, sized, with a circuit
breaker), the target turning over SQLite, PostgreSQL, PgBouncer and MariaDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, delete, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import (
    Batch,
    CircuitBreaker,
    Outbox,
    RateLimit,
    RetryAfter,
    RetryPolicy,
    add_events,
    add_events_async,
    schema,
)
from outbox.testing import drain
from tests._support import NO_RETRY_AFTER_FLOOR
from tests.handler_kinds import HANDLER_KINDS, HandlerKind
from tests.users import _column_types as types

NO_WAIT = RetryPolicy(max_attempts=3, scale=0, base_delay=0, jitter=0)
# Two groups per transaction's worth of events: the first call fails, so one group is retried.
BATCH_SIZE = 3


class RolledBack(Exception):  # noqa: N818 - what the writing transaction was made to do
    """Raised inside a writing transaction to roll it back."""


# --- ways of writing events ------------------------------------------------------------------
# Each writes unsaved instances of the model in one transaction of its own kind, which commits,
# or rolls back when ``roll_back`` is set (the events were written, then the transaction failed).


AsyncUrl = tuple[str, dict[str, Any]]
"""An async engine's URL and its options."""


def _core_rows(model: type[Any], events: list[Any]) -> list[list[dict[str, Any]]]:
    """The instances as ``add_events`` rows (keyed by column key, set attributes only), in
    runs of rows that set the same keys: one ``add_events`` call takes one such run."""
    mapper = inspect(model)
    keys = {prop.key: prop.columns[0].key for prop in mapper.column_attrs}
    rows = [
        {keys[name]: value for name, value in vars(event).items() if name in keys}
        for event in events
    ]
    return [list(run) for _, run in itertools.groupby(rows, key=lambda row: sorted(row))]


def _add_events(session: Session | Connection, model: type[Any], events: list[Any]) -> None:
    for rows in _core_rows(model, events):
        add_events(session, model, rows)


async def _add_events_async(
    session: AsyncSession | AsyncConnection, model: type[Any], events: list[Any]
) -> None:
    for rows in _core_rows(model, events):
        await add_events_async(session, model, rows)


@contextlib.contextmanager
def _rolled_back_if(roll_back: bool) -> Iterator[None]:
    with contextlib.suppress(RolledBack):
        yield


def _end(roll_back: bool) -> None:
    if roll_back:
        raise RolledBack


def _orm_session(
    engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool
) -> None:
    with _rolled_back_if(rb), Session(engine) as session, session.begin():
        session.add_all(events)
        _end(rb)


def _session(engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool) -> None:
    with _rolled_back_if(rb), Session(engine) as session, session.begin():
        _add_events(session, model, events)
        _end(rb)


def _connection(
    engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool
) -> None:
    with _rolled_back_if(rb), engine.begin() as conn:
        _add_events(conn, model, events)
        _end(rb)


def _on_async_engine(url: AsyncUrl, write: Callable[[AsyncEngine], Awaitable[None]]) -> None:
    async def run() -> None:
        engine = create_async_engine(url[0], **url[1])
        try:
            await write(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())


def _orm_async_session(
    engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool
) -> None:
    async def write(async_engine: AsyncEngine) -> None:
        with _rolled_back_if(rb):
            async with AsyncSession(async_engine) as session, session.begin():
                session.add_all(events)
                _end(rb)

    _on_async_engine(url, write)


def _async_session(
    engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool
) -> None:
    async def write(async_engine: AsyncEngine) -> None:
        with _rolled_back_if(rb):
            async with AsyncSession(async_engine) as session, session.begin():
                await _add_events_async(session, model, events)
                _end(rb)

    _on_async_engine(url, write)


def _async_connection(
    engine: Engine, url: AsyncUrl, model: type[Any], events: list[Any], rb: bool
) -> None:
    async def write(async_engine: AsyncEngine) -> None:
        with _rolled_back_if(rb):
            async with async_engine.begin() as conn:
                await _add_events_async(conn, model, events)
                _end(rb)

    _on_async_engine(url, write)


SESSION_KINDS: dict[str, Callable[[Engine, AsyncUrl, type[Any], list[Any], bool], None]] = {
    "orm_session": _orm_session,
    "session_add_events": _session,
    "connection": _connection,
    "orm_async_session": _orm_async_session,
    "async_session_add_events": _async_session,
    "async_connection": _async_connection,
}

# --- database targets ------------------------------------------------------------------------

SQLITE, POSTGRESQL, PGBOUNCER, MARIADB = "sqlite", "postgresql", "pgbouncer", "mariadb"
TARGETS = (SQLITE, POSTGRESQL, PGBOUNCER)
# Flow control's matrix writes with a sync ORM session only, so MariaDB (no async driver among
# this project's) joins it.
FLOW_TARGETS = (SQLITE, POSTGRESQL, PGBOUNCER, MARIADB)
# The async driver an application uses on each target. Through a transaction pooler, psycopg's
# automatic server-side prepared statements must be off on the application's side too.
ASYNC_DRIVERS = {SQLITE: "sqlite+aiosqlite", POSTGRESQL: "postgresql+asyncpg"}


@dataclasses.dataclass(frozen=True)
class Target:
    """A database as the application and outbox reach it."""

    name: str
    url: str
    """outbox's URL, and the application's sync one."""
    async_url: str
    async_options: dict[str, Any]

    @property
    def dialect(self) -> str:
        return {SQLITE: types.SQLITE, MARIADB: types.MARIADB}.get(self.name, types.POSTGRESQL)


@pytest.fixture(scope="module")
def sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite file shared by the module's SQLite cases."""
    return f"sqlite:///{tmp_path_factory.mktemp('matrix')}/matrix.sqlite3"


def _target(request: pytest.FixtureRequest, name: str) -> Target:
    if name == SQLITE:
        url = request.getfixturevalue("sqlite_file")
        return Target(name, url, url.replace("sqlite:", ASYNC_DRIVERS[SQLITE] + ":", 1), {})
    if name == POSTGRESQL:
        url = request.getfixturevalue("postgres_url")
        async_url = make_url(url).set(drivername=ASYNC_DRIVERS[POSTGRESQL])
        return Target(name, url, async_url.render_as_string(hide_password=False), {})
    if name == MARIADB:
        return Target(name, request.getfixturevalue("mariadb_url"), "", {})
    url = request.getfixturevalue("pgbouncer").url
    async_url = make_url(url).set(drivername="postgresql+psycopg_async")
    pooled = {"connect_args": {"prepare_threshold": None}}
    return Target(name, url, async_url.render_as_string(hide_password=False), pooled)


@pytest.fixture(scope="module")
def tables_made() -> set[str]:
    """The targets whose tables this module has created."""
    return set()


@pytest.fixture
def target(
    request: pytest.FixtureRequest, tables_made: set[str]
) -> Iterator[tuple[Target, Engine]]:
    """The case's target with outbox's tables and the typed buffer, emptied; a sync engine."""
    found = _target(request, request.param)
    model = types.buffer_model(found.dialect)
    engine = create_engine(found.url, **found.async_options)
    # Created once per database (PgBouncer's is PostgreSQL's), emptied for every case.
    database = found.dialect if found.name != SQLITE else SQLITE
    with engine.begin() as conn:
        if database not in tables_made:
            types.UsersBase.metadata.drop_all(conn, tables=[model.__table__])
            schema.metadata.drop_all(conn)
            schema.metadata.create_all(conn)
            types.UsersBase.metadata.create_all(conn, tables=[model.__table__])
            tables_made.add(database)
        for table in (model.__table__, *schema.metadata.sorted_tables):
            conn.execute(delete(table))
    try:
        yield found, engine
    finally:
        engine.dispose()


# --- the cases -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    handler: HandlerKind
    session: str
    target: str

    @property
    def id(self) -> str:
        return f"{self.handler.name}-{self.session}-{self.target}"


def pairwise() -> list[Case]:
    """Every (handler, session) pair once, with the target turning so that every (handler,
    target) and every (session, target) pair occurs too."""
    sessions = list(SESSION_KINDS)
    return [
        Case(handler, session, TARGETS[(i + j) % len(TARGETS)])
        for i, handler in enumerate(HANDLER_KINDS)
        for j, session in enumerate(sessions)
    ]


CASES = pairwise()


class Recorder:
    """What the handler received, by event id. Its first call fails (``first="raise"``), is
    answered "later" for the whole group (``"retry_after"``), or defers every other event
    (``"defer_some"``)."""

    def __init__(self, model: type[Any], first: str = "raise") -> None:
        self.names = types.attribute_names(model)
        self.received: dict[int, dict[str, Any]] = {}
        self.calls = 0
        self.first = first

    def __call__(self, batch: Batch[Any]) -> None:
        self.calls += 1
        deferred: set[int] = set()
        if self.calls == 1 and self.first == "raise":
            raise RuntimeError("the first call fails")
        if self.calls == 1 and self.first == "retry_after":
            raise RetryAfter(0, reason="429")
        if self.calls == 1 and self.first == "defer_some":
            batch.retry(batch.events[::2], "429 for these", after=0)
            deferred = {event.id for event in batch.events[::2]}
        for event in batch.events:
            if event.id not in deferred:
                self.received[event.id] = {name: getattr(event, name) for name in self.names}


@pytest.mark.parametrize(
    ("case", "target"),
    [pytest.param(case, case.target, id=case.id) for case in CASES],
    indirect=["target"],
)
def test_every_committed_event_reaches_the_handler_intact(
    case: Case, target: tuple[Target, Engine]
) -> None:
    """Committed events reach any kind of handler, written any way, with their values intact."""
    where, engine = target
    model = types.buffer_model(where.dialect)
    write = SESSION_KINDS[case.session]
    committed = types.new_events(model, where.dialect)
    async_url = (where.async_url, where.async_options)
    for events, roll_back in ((committed, False), (types.new_events(model, where.dialect), True)):
        write(engine, async_url, model, events, roll_back)
    recorder = Recorder(model)

    expected, found, left = _drain_into(recorder, case.handler, where, engine, model)

    assert len(committed) == len(expected)
    assert sorted(expected) == sorted(recorder.received)
    assert {} == found.summary(), found.report()
    assert [] == left


def _drain_into(
    recorder: Recorder,
    kind: HandlerKind,
    where: Target,
    engine: Engine,
    model: type[Any],
    **options: Any,
) -> tuple[dict[int, dict[str, Any]], types.Mismatches, list[Any]]:
    """Drain the buffer into a handler of ``kind`` around ``recorder``: what ``session.get``
    loaded of the buffer before, every received value that differs from it, the rows left."""
    with Session(engine) as session:
        ids = list(session.scalars(select(model.id).order_by(model.id)))
        expected = types.loaded(session, model, ids)
    app = Outbox(where.url, settings=NO_RETRY_AFTER_FLOOR)
    app.handler(model, name="matrix", batch_size=BATCH_SIZE, retry=NO_WAIT, **options)(
        kind.build(recorder)
    )
    try:
        drain(app)
    finally:
        app.engine.dispose()
    found = types.Mismatches(where.dialect)
    for id_, values in recorder.received.items():
        found.compare(expected[id_], values, f"id {id_}")
    with engine.connect() as conn:
        left = list(conn.execute(select(model.id)).all())
    return expected, found, left


# --- flow control over handler kinds -----------------------------------------------------------

FLOW_OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "retry_after": ({}, "retry_after"),
    "partial_deferral": ({}, "defer_some"),
    "keyed": ({"group_by": "position"}, "raise"),
    "ordered": ({"ordering_key": "position"}, "raise"),
    "rate_limited": ({"rate_limit": RateLimit(calls_per_second=10_000)}, "raise"),
    "per_key_rate_limit": (
        {"rate_limit": RateLimit(calls_per_second=10_000), "rate_limit_key": "position"},
        "raise",
    ),
    "bisect": ({"bisect": True}, "raise"),
    "sized": ({"max_batch_bytes": 1_000_000}, "raise"),
    "circuit_breaker": ({"circuit_breaker": CircuitBreaker(failures=2)}, "raise"),
}
"""Flow control's options, each with what the handler's first call does."""


@dataclasses.dataclass(frozen=True)
class FlowCase:
    handler: HandlerKind
    flow: str
    target: str

    @property
    def id(self) -> str:
        return f"{self.handler.name}-{self.flow}-{self.target}"


def flow_cases() -> list[FlowCase]:
    """Every (handler kind, flow option) pair once, the target turning so that every (handler,
    target) and every (flow option, target) pair occurs too."""
    return [
        FlowCase(handler, flow, FLOW_TARGETS[(i + j) % len(FLOW_TARGETS)])
        for i, handler in enumerate(HANDLER_KINDS)
        for j, flow in enumerate(FLOW_OPTIONS)
    ]


@pytest.mark.parametrize(
    ("case", "target"),
    [pytest.param(case, case.target, id=case.id) for case in flow_cases()],
    indirect=["target"],
)
def test_flow_control_delivers_every_event_intact_to_any_kind_of_handler(
    case: FlowCase, target: tuple[Target, Engine]
) -> None:
    """Whatever flow control a handler has, and whatever kind of callable it is: its first
    call fails, is deferred whole or in part, and every committed event still reaches it once,
    its values as ``session.get`` loads them."""
    where, engine = target
    model = types.buffer_model(where.dialect)
    _orm_session(engine, ("", {}), model, types.new_events(model, where.dialect), False)
    options, first = FLOW_OPTIONS[case.flow]
    recorder = Recorder(model, first)

    expected, found, left = _drain_into(recorder, case.handler, where, engine, model, **options)

    assert (sorted(expected), [], True) == (sorted(recorder.received), left, recorder.calls > 1)
    assert {} == found.summary(), found.report()
