"""The Prometheus gauges of an application serving several databases: each database's samples
labelled with its name, read at once, and one that is down or hung reported as its own scrape
error while the others are reported."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, insert

from outbox import Batch, Outbox, Settings, schema
from outbox.prometheus import OutboxCollector, WorkerMetrics
from outbox.results import SUCCEEDED, BatchResult
from tests import _support
from tests.acceptance import many_app

UNCLAIMED = "outbox_unclaimed_events"


def _tables_with_events(url: str, tenant: str, count: int) -> None:
    engine = create_engine(url)
    schema.metadata.create_all(engine)
    many_app.Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(many_app.TenantEvent.__table__), [{"tenant": tenant}] * count)
    engine.dispose()


def _many(databases: dict[str, str]) -> Outbox:
    app = Outbox(databases=lambda: databases, settings=Settings(network_timeout=5.0))

    @app.handler(many_app.TenantEvent, name="deliver")
    def deliver(batch: Batch[many_app.TenantEvent]) -> None: ...

    return app


@pytest.fixture
def silent_port() -> Iterator[int]:
    with _support.silent_server() as port:
        yield port


def test_each_database_is_labelled_and_one_down_or_hung_is_its_own_error(
    tmp_path: Path, silent_port: int
) -> None:
    """Two SQLite databases with 3 and 5 events, a PostgreSQL URL on a closed port and one on
    a server that never answers: the first two are reported, each under its name; the other
    two are scrape errors of their own, and the hung one holds one reading thread however
    often it is scraped."""
    databases = {
        "eu": f"sqlite:///{tmp_path / 'eu.sqlite3'}",
        "us": f"sqlite:///{tmp_path / 'us.sqlite3'}",
        "down": "postgresql+psycopg://postgres@127.0.0.1:1/x",
        "hung": f"postgresql+psycopg://postgres@127.0.0.1:{silent_port}/x",
    }
    _tables_with_events(databases["eu"], "eu", 3)
    _tables_with_events(databases["us"], "us", 5)
    registry = CollectorRegistry()
    registry.register(OutboxCollector(_many(databases), timeout=0.5))

    def sample(name: str, database: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"database": database, **labels})

    handler = {"handler": "deliver", "band": "HOUR"}
    scrapes = [[sample("outbox_scrape_error", name) for name in databases] for _ in range(3)]
    unclaimed = [sample(UNCLAIMED, name, **handler) for name in databases]
    readers = [t for t in threading.enumerate() if t.name == "outbox-scrape hung"]
    assert [[0.0, 0.0, 1.0, 1.0]] * 3 == scrapes
    assert [3.0, 5.0, None, None] == unclaimed
    assert 1 == len(readers)


def test_a_database_of_several_alone_is_labelled_with_its_name(tmp_path: Path) -> None:
    """``app.on(name)``'s gauges carry ``database`` too, as the worker's counters do, so that a
    worker serving ``--database NAME`` has series that add up with the others'."""
    url = f"sqlite:///{tmp_path / 'eu.sqlite3'}"
    _tables_with_events(url, "eu", 2)
    app = _many({"eu": url}).on("eu")
    registry = CollectorRegistry()
    registry.register(OutboxCollector(app))
    counters = WorkerMetrics(registry, database="eu")
    counters.callback(app)(BatchResult("deliver", uuid.uuid4(), 1, SUCCEEDED, size=2, succeeded=2))
    labels = {"database": "eu", "handler": "deliver", "band": "HOUR"}
    assert (2.0, 2.0) == (
        registry.get_sample_value(UNCLAIMED, labels),
        registry.get_sample_value("outbox_events_total", {**labels, "outcome": "succeeded"}),
    )


def test_a_registry_that_fails_is_one_scrape_error() -> None:
    """The registry function itself raising: one error sample, no gauges, nothing raised."""

    def broken() -> dict[str, str]:
        raise RuntimeError("tenant service down")

    registry = CollectorRegistry()
    registry.register(OutboxCollector(Outbox(databases=broken)))
    assert 1.0 == registry.get_sample_value("outbox_scrape_error", {"database": ""})


def _scrape_errors(registry: CollectorRegistry) -> dict[str, float]:
    """``outbox_scrape_error`` by database, from one scrape."""
    return {
        sample.labels["database"]: sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "outbox_scrape_error"
    }


def test_a_scrape_reads_the_registry_once_and_bounds_a_registry_that_hangs(
    tmp_path: Path,
) -> None:
    """One reading of the registry a scrape, whatever the number of databases; a registry
    that does not answer within the scrape's bound is a scrape error, not a hung scrape."""
    listed = {name: f"sqlite:///{tmp_path / name}.sqlite3" for name in ("a", "b", "c", "d")}
    for name, url in listed.items():
        _tables_with_events(url, name, 1)
    calls: list[float] = []
    released = threading.Event()

    def registry() -> dict[str, str]:
        calls.append(time.monotonic())
        if len(calls) > 1:
            released.wait(30)
        return listed

    collector = CollectorRegistry()
    collector.register(OutboxCollector(Outbox(databases=registry), timeout=0.5))
    first = _scrape_errors(collector)
    hung = _scrape_errors(collector)
    answered_before_release = not released.is_set()
    released.set()
    assert (dict.fromkeys(listed, 0.0), {"": 1.0}, 2, True) == (
        first,
        hung,
        len(calls),
        answered_before_release,
    )
