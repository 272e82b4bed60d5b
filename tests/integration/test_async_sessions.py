"""Writing events from async code: AsyncSession and AsyncConnection, and outbox on async URLs.

Every test runs on SQLite through aiosqlite and on PostgreSQL through asyncpg and through
psycopg's async side. A second, sync connection looks at what was committed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from asyncio import current_task
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from outbox import Batch, Outbox, add_events, add_events_async
from outbox.testing import drain
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent, Order

ASYNC_DRIVERS = {
    "aiosqlite": "sqlite+aiosqlite",
    "asyncpg": "postgresql+asyncpg",
    "psycopg_async": "postgresql+psycopg_async",
}
SESSION_KINDS = ["AsyncSession", "AsyncConnection"]
ROWS = [{"activity_id": n} for n in range(3)]


@dataclass(frozen=True)
class Database:
    """One migrated, empty database, by its sync URL and by an async driver's URL."""

    url: str
    async_url: str


@pytest.fixture(params=list(ASYNC_DRIVERS))
def database(request: pytest.FixtureRequest, tmp_path: object) -> Database:
    """A migrated database of each kind, empty, with the URL of one of its async drivers."""
    if request.param == "aiosqlite":
        url = f"sqlite:///{tmp_path}/outbox.sqlite3"
        reset_schema(url)
    else:
        url = request.getfixturevalue("postgres_database")
    async_url = make_url(url).set(drivername=ASYNC_DRIVERS[request.param])
    return Database(url, async_url.render_as_string(hide_password=False))


@pytest.fixture
def observer(database: Database) -> Iterator[Engine]:
    """A second, sync engine: what other connections can see."""
    engine = create_engine(database.url)
    yield engine
    engine.dispose()


@pytest.fixture
def keep() -> Iterator[Callable[[Outbox], Outbox]]:
    """Register an Outbox application to have its engine disposed after the test."""
    made: list[Outbox] = []

    def register(app: Outbox) -> Outbox:
        made.append(app)
        return app

    yield register
    for app in made:
        if app._engine is not None:
            app._engine.dispose()


def recorded(app: Outbox) -> list[int]:
    """Register a handler of ActivityEvent on ``app``; the activity ids it handled."""
    handled: list[int] = []

    @app.handler(ActivityEvent, name="record_activity")
    def record_activity(batch: Batch[ActivityEvent]) -> None:
        handled.extend(event.activity_id for event in batch.events)

    return handled


def counts(engine: Engine) -> tuple[int, int]:
    """(orders, activity events) committed, as another connection sees them."""
    with engine.connect() as conn:
        orders = conn.execute(select(func.count()).select_from(Order)).scalar_one()
        events = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    return int(orders), int(events)


@asynccontextmanager
async def transaction(async_url: str, kind: str) -> AsyncIterator[AsyncSession | AsyncConnection]:
    """An AsyncSession or AsyncConnection on an engine of its own, in which an order is written;
    rolled back unless the caller commits."""
    engine = create_async_engine(async_url)
    try:
        if kind == "AsyncSession":
            async with AsyncSession(engine) as session:
                session.add(Order(id=1, reference="A-1"))
                yield session
        else:
            async with engine.connect() as conn:
                await conn.execute(insert(Order).values(id=1, reference="A-1"))
                yield conn
    finally:
        await engine.dispose()


async def write_order_and_events(
    async_url: str, kind: str, rows: Sequence[Mapping[str, Any]], *, commit: bool = True
) -> int:
    """In one transaction of ``kind``: an order, and ``rows`` written with add_events_async;
    committed or rolled back. Returns what add_events_async returned."""
    async with transaction(async_url, kind) as target:
        written = await add_events_async(target, ActivityEvent, rows)
        await (target.commit() if commit else target.rollback())
    return written


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_add_events_async_commits_events_with_the_business_row(
    database: Database, observer: Engine, kind: str
) -> None:
    """Events written with add_events_async are committed with the order beside them."""
    written = asyncio.run(write_order_and_events(database.async_url, kind, ROWS))

    assert (3, (1, 3)) == (written, counts(observer))


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_add_events_async_rolls_back_with_the_business_row(
    database: Database, observer: Engine, kind: str
) -> None:
    """Events written with add_events_async roll back with the order beside them."""
    asyncio.run(write_order_and_events(database.async_url, kind, ROWS, commit=False))

    assert (0, 0) == counts(observer)


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_add_events_async_leaves_the_events_uncommitted(
    database: Database, observer: Engine, kind: str
) -> None:
    """Until the caller commits, no other connection sees the events add_events_async wrote."""

    async def write_and_look() -> tuple[int, int]:
        async with transaction(database.async_url, kind) as target:
            await add_events_async(target, ActivityEvent, ROWS)
            return counts(observer)

    assert (0, 0) == asyncio.run(write_and_look())


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_events_written_with_add_events_async_are_handled(
    database: Database, keep: Callable[[Outbox], Outbox], kind: str
) -> None:
    """drain() hands the events add_events_async committed to their handler."""
    asyncio.run(write_order_and_events(database.async_url, kind, ROWS))
    app = keep(Outbox(database.url))
    handled = recorded(app)

    drain(app)

    assert [0, 1, 2] == sorted(handled)


def test_session_add_on_an_async_session_writes_a_handled_event(
    database: Database, keep: Callable[[Outbox], Outbox]
) -> None:
    """session.add(Model(...)) on an AsyncSession writes an event that drain() hands over."""

    async def write() -> None:
        engine = create_async_engine(database.async_url)
        try:
            async with AsyncSession(engine) as session, session.begin():
                session.add(Order(id=1, reference="A-1"))
                session.add(ActivityEvent(activity_id=41))
        finally:
            await engine.dispose()

    asyncio.run(write())
    app = keep(Outbox(database.url))
    handled = recorded(app)

    drain(app)

    assert [41] == handled


def test_add_events_async_takes_an_async_scoped_session(
    database: Database, observer: Engine
) -> None:
    """add_events_async writes through an async_scoped_session's current session."""

    async def write() -> int:
        engine = create_async_engine(database.async_url)
        scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=current_task)
        try:
            written = await add_events_async(scoped, ActivityEvent, ROWS)
            await scoped.commit()
            return written
        finally:
            await scoped.remove()
            await engine.dispose()

    written = asyncio.run(write())

    assert (3, (0, 3)) == (written, counts(observer))


def test_add_events_async_refuses_a_group_id_before_writing(
    database: Database, observer: Engine
) -> None:
    """add_events_async makes add_events' key checks: a row with group_id writes nothing."""

    async def write() -> str:
        async with transaction(database.async_url, "AsyncSession") as session:
            with pytest.raises(TypeError) as raised:
                await add_events_async(
                    session, ActivityEvent, [{"activity_id": 1, "group_id": None}]
                )
            await session.commit()
        return str(raised.value)

    message = asyncio.run(write())

    assert ("'group_id'" in message, (1, 0)) == (True, counts(observer))


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_sync_add_events_refuses_an_async_session_and_writes_nothing(
    database: Database, observer: Engine, kind: str
) -> None:
    """add_events given an async session raises a TypeError naming it; its commit has no event."""

    async def write() -> str:
        async with transaction(database.async_url, kind) as target:
            with pytest.raises(TypeError) as raised:
                add_events(target, ActivityEvent, ROWS)  # type: ignore[arg-type]
            await target.commit()
        return str(raised.value)

    message = asyncio.run(write())

    expected = (
        f"add_events takes a Session or a Connection, got {kind}; "
        "with an async session or connection, await outbox.add_events_async(...)"
    )
    assert (expected, (1, 0)) == (message, counts(observer))


def test_add_events_async_refuses_a_sync_session(database: Database) -> None:
    """add_events_async given a sync Session raises a TypeError that names add_events."""
    engine = create_engine(database.url)
    try:
        with Session(engine) as session, pytest.raises(TypeError) as raised:
            asyncio.run(add_events_async(session, ActivityEvent, ROWS))  # type: ignore[arg-type]
    finally:
        engine.dispose()

    expected = (
        "add_events_async takes an AsyncSession or an AsyncConnection, got Session; "
        "with a Session or a Connection, call outbox.add_events(...)"
    )
    assert expected == str(raised.value)


def test_sync_add_events_takes_a_scoped_session(database: Database, observer: Engine) -> None:
    """add_events writes through a scoped_session's current session."""
    engine = create_engine(database.url)
    scoped = scoped_session(sessionmaker(engine))
    try:
        written = add_events(scoped, ActivityEvent, ROWS)
        scoped.commit()
    finally:
        scoped.remove()
        engine.dispose()

    assert (3, (0, 3)) == (written, counts(observer))


def test_outbox_on_an_async_engine_drains_events(
    database: Database, keep: Callable[[Outbox], Outbox]
) -> None:
    """Outbox(engine=AsyncEngine) runs on a sync engine of its own and hands the events over."""
    asyncio.run(write_order_and_events(database.async_url, "AsyncSession", ROWS))
    app = keep(Outbox(engine=create_async_engine(database.async_url)))
    handled = recorded(app)

    drain(app)

    assert [0, 1, 2] == sorted(handled)


def test_outbox_on_an_async_url_drains_events(
    database: Database, keep: Callable[[Outbox], Outbox]
) -> None:
    """Outbox(async URL) runs on the driver's sync sibling and hands the events over."""
    asyncio.run(write_order_and_events(database.async_url, "AsyncConnection", ROWS))
    app = keep(Outbox(database.async_url))
    handled = recorded(app)

    drain(app)

    assert [0, 1, 2] == sorted(handled)


def test_outbox_on_an_async_engine_reads_json_as_that_engine_does(
    database: Database, keep: Callable[[Outbox], Outbox]
) -> None:
    """An AsyncEngine's json_deserializer decides what a handler's JSON values are, as it
    decides what session.get returns."""
    engine = create_async_engine(
        database.async_url, json_deserializer=functools.partial(json.loads, parse_float=Decimal)
    )

    async def write_and_load() -> Any:
        async with AsyncSession(engine) as session:
            session.add(EmailEvent(address="a@example.com", data={"amount": 1.25}))
            await session.commit()
        async with AsyncSession(engine) as session:
            (loaded,) = (await session.scalars(select(EmailEvent))).all()
            return loaded.data

    loaded = asyncio.run(write_and_load())
    app = keep(Outbox(engine=engine))
    handled: list[Any] = []

    @app.handler(EmailEvent)
    def record_email(batch: Batch[EmailEvent]) -> None:
        handled.extend(event.data for event in batch.events)

    drain(app)
    asyncio.run(engine.dispose())

    assert {"amount": Decimal("1.25")} == loaded
    assert [loaded] == handled
    assert [Decimal] == [type(data["amount"]) for data in handled]
