"""Fixtures of the executor conformance suite: each test runs on every executor
(:mod:`tests.executors._executors`) and every database (SQLite, PostgreSQL, MariaDB).

The tables are created by the first test of each database and emptied of rows before every
later one, as in the database conformance suite: the same empty tables at a fraction of the
cost, so that the suite takes seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete

from outbox import Outbox, Settings, schema
from tests.conftest import reset_schema
from tests.executors._executors import EXECUTORS, Executor
from tests.models import Base

DATABASES = ("sqlite", "postgresql", "mariadb")
_TABLES = [*schema.metadata.sorted_tables, *Base.metadata.sorted_tables]


@pytest.fixture(scope="session")
def _created() -> set[str]:
    """The databases whose tables this session has created."""
    return set()


@pytest.fixture(scope="session")
def _sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("executors") / "outbox.sqlite3"
    return f"sqlite:///{path}"


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, _created: set[str]) -> str:
    """The URL of a migrated database of each kind, its tables empty."""
    name = {"sqlite": "_sqlite_url", "postgresql": "postgres_url", "mariadb": "mariadb_url"}
    url: str = request.getfixturevalue(name[request.param])
    if url not in _created:
        reset_schema(url)
        _created.add(url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for table in reversed(_TABLES):
                conn.execute(delete(table))
    finally:
        engine.dispose()
    return url


@pytest.fixture
def outbox_app(database: str) -> Iterator[Callable[..., Outbox]]:
    """Build the test's application on ``database`` (settings optional); disposed after."""
    apps: list[Outbox] = []

    def make(settings: Settings | None = None) -> Outbox:
        app = Outbox(database, settings=settings)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.engine.dispose()


@pytest.fixture(params=sorted(EXECUTORS))
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    """Each executor, stopped after the test."""
    running = EXECUTORS[request.param]()
    try:
        yield running
    finally:
        running.stop()
