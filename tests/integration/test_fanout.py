"""Fan-out (``Outbox.fanout``): one row written, a copy per consumer, each consumer a buffer
with its own handler. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, RetryPolicy
from outbox.exceptions import BufferTableMissingError, ConfigurationError
from outbox.ops import flow
from outbox.testing import drain
from tests.models import (
    EmailEvent,
    ShipmentAnalytics,
    ShipmentEvent,
    ShipmentPartner,
    ShipmentSearch,
)

CONSUMERS = (ShipmentSearch, ShipmentPartner, ShipmentAnalytics)
IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)


def _write(engine: Engine, count: int, start: int = 0) -> list[int]:
    with Session(engine) as session, session.begin():
        events = [
            ShipmentEvent(shipment_id=n, amount=Decimal(f"{n}.25"), data={"n": n, "tags": ["a"]})
            for n in range(start, start + count)
        ]
        session.add_all(events)
        session.flush()
        return [event.id for event in events]


def _count(engine: Engine, model: type[Any]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def _fanned_out(
    app: Outbox, seen: dict[str, list[tuple[Any, ...]]], consumers: tuple[type[Any], ...]
) -> None:
    app.fanout(ShipmentEvent, to=consumers, batch_size=7)
    for model in consumers:
        name = model.__tablename__

        def handle(batch: Batch[Any], name: str = name) -> None:
            seen.setdefault(name, []).extend(
                (e.id, e.shipment_id, e.amount, e.data, e.created_at) for e in batch
            )

        app.handler(model, name=name, batch_size=5)(handle)


def test_each_consumer_gets_every_event_once_under_its_id_and_write_time(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """40 events written once: each of three consumers is handed each of them once, with the
    application's id, values and ``created_at``; the source and the copies are empty after."""
    app = make_app(database_url)
    seen: dict[str, list[tuple[Any, ...]]] = {}
    _fanned_out(app, seen, CONSUMERS)
    ids = _write(app.engine, 40)
    with app.engine.connect() as conn:
        written = conn.execute(
            select(
                ShipmentEvent.id,
                ShipmentEvent.shipment_id,
                ShipmentEvent.amount,
                ShipmentEvent.data,
                ShipmentEvent.created_at,
            ).order_by(ShipmentEvent.id)
        ).all()
    drain(app)
    assert {m.__tablename__ for m in CONSUMERS} == set(seen)
    for got in seen.values():
        assert [tuple(row) for row in written] == sorted(got)
    assert ids == [row[0] for row in written]
    assert [0, 0, 0, 0] == [_count(app.engine, m) for m in (ShipmentEvent, *CONSUMERS)]


def test_a_paused_consumer_holds_back_no_other_and_gets_its_events_when_resumed(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """One consumer paused: the fan-out and the other consumers go on; its copies wait in its
    own buffer, and are handled once it is resumed."""
    app = make_app(database_url)
    seen: dict[str, list[tuple[Any, ...]]] = {}
    _fanned_out(app, seen, CONSUMERS)
    flow.pause(app, ShipmentPartner.__tablename__, actor="test")
    _write(app.engine, 20)
    drain(app)
    assert 0 == _count(app.engine, ShipmentEvent)
    assert 20 == _count(app.engine, ShipmentPartner)
    assert [20, 20] == [len(seen[m.__tablename__]) for m in (ShipmentSearch, ShipmentAnalytics)]
    assert ShipmentPartner.__tablename__ not in seen
    flow.resume(app, ShipmentPartner.__tablename__, actor="test")
    drain(app)
    assert 20 == len(seen[ShipmentPartner.__tablename__])


def test_a_failing_consumer_retries_on_its_own(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """One consumer fails its first call: it retries its own group; the others were handed
    each event once, and nothing is copied twice."""
    app = make_app(database_url)
    app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentPartner])
    calls: dict[str, int] = {}
    got: list[int] = []

    @app.handler(ShipmentSearch, retry=IMMEDIATE)
    def search(batch: Batch[ShipmentSearch]) -> None:
        calls["search"] = calls.get("search", 0) + 1
        if calls["search"] == 1:
            raise RuntimeError("the index is down")
        got.extend(batch.ids)

    @app.handler(ShipmentPartner)
    def partner(batch: Batch[ShipmentPartner]) -> None:
        got.extend(batch.ids)

    ids = _write(app.engine, 10)
    drain(app)
    assert sorted(ids * 2) == sorted(got)
    assert 2 == calls["search"]


def test_a_consumers_missing_table_is_named_and_its_events_stay(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A consumer whose buffer table does not exist: the drain refuses in one line naming it,
    and the source keeps every event."""
    app = make_app(database_url)
    app.fanout(ShipmentEvent, to=[ShipmentSearch])
    _write(app.engine, 3)
    ShipmentSearch.__table__.drop(app.engine)  # type: ignore[attr-defined]
    named = "'test_shipment_search' of handler 'test_shipment_events.fanout'"
    with pytest.raises(BufferTableMissingError, match=named):
        drain(app)
    assert 3 == _count(app.engine, ShipmentEvent)


def test_a_target_without_a_column_of_the_source_is_refused_where_it_is_given(
    make_app: Callable[..., Outbox],
) -> None:
    app = make_app("sqlite://")
    with pytest.raises(ConfigurationError, match=r"EmailEvent .*has no column 'shipment_id'"):
        app.fanout(ShipmentEvent, to=[EmailEvent])
    with pytest.raises(ConfigurationError, match="is the source itself"):
        app.fanout(ShipmentEvent, to=[ShipmentEvent])
    with pytest.raises(ConfigurationError, match="given twice"):
        app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentSearch])
    with pytest.raises(ConfigurationError, match="to must be a list"):
        app.fanout(ShipmentEvent, to=ShipmentSearch)  # type: ignore[arg-type]
    app.fanout(ShipmentEvent, to=[ShipmentSearch])
    with pytest.raises(ConfigurationError, match=r"consumer of 'test_shipment_events\.fanout'"):
        app.fanout(ShipmentPartner, to=[ShipmentSearch])
