"""The inboxes' Prometheus gauges: read at each scrape as ``outbox.ops.inboxes`` reads them,
labelled with the inbox, and with the database for an application serving several."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, update

from outbox import Outbox, schema
from outbox._db.dialects import db_now_plus
from outbox.inbox import Inbox
from outbox.prometheus import OutboxCollector, register

HOUR = 3600.0
CLOCK_TOLERANCE_SECONDS = 60.0


def _receive(url: str, inbox: Inbox, count: int) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        inbox.receive_many(conn, [f"{inbox.name}-{n}" for n in range(count)])
    engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_each_inbox_has_its_ids_oldest_expired_and_horizon_gauges(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A declared inbox of 3 ids (one past its horizon) and 2 ids of an inbox the application
    does not declare: each is a series of its own; only the declared one has a horizon."""
    app = make_app(database_url)
    orders = app.inbox("orders", horizon=HOUR)
    _receive(database_url, orders, 3)
    _receive(database_url, Inbox("legacy", horizon=60), 2)
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.inbox)
            .where(schema.inbox.c.message_id == "orders-0")
            .values(expires_at=db_now_plus(-60))
        )
    registry = CollectorRegistry()
    register(app, registry)

    def sample(name: str, inbox: str) -> float | None:
        return registry.get_sample_value(name, {"inbox": inbox})

    oldest = sample("outbox_inbox_oldest_seconds", "orders")
    assert (
        [3.0, 2.0],
        [1.0, 0.0],
        [HOUR, None],
        True,
        0.0,
    ) == (
        [sample("outbox_inbox_ids", name) for name in ("orders", "legacy")],
        [sample("outbox_inbox_expired_ids", name) for name in ("orders", "legacy")],
        [sample("outbox_inbox_horizon_seconds", name) for name in ("orders", "legacy")],
        oldest is not None and 0 <= oldest <= CLOCK_TOLERANCE_SECONDS,
        registry.get_sample_value("outbox_scrape_error"),
    )


def test_each_database_s_inboxes_carry_its_name(tmp_path: Path) -> None:
    """Of an application serving two databases, each database's inbox series carry its
    ``database`` label, a declared inbox with no ids reading 0."""
    databases = {name: f"sqlite:///{tmp_path / name}.sqlite3" for name in ("eu", "us")}
    for url in databases.values():
        engine = create_engine(url)
        schema.metadata.create_all(engine)
        engine.dispose()
    app = Outbox(databases=lambda: databases)
    orders = app.inbox("orders")
    _receive(databases["eu"], orders, 4)
    registry = CollectorRegistry()
    registry.register(OutboxCollector(app))

    found = {
        name: registry.get_sample_value("outbox_inbox_ids", {"database": name, "inbox": "orders"})
        for name in databases
    }

    assert {"eu": 4.0, "us": 0.0} == found
