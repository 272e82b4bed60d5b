"""Fixtures of the executor conformance suite: each test runs on every executor
(:mod:`tests.executors._executors`) and every database (SQLite, PostgreSQL, MariaDB). The
Celery executor, whose worker takes about a second a test to start and stop, runs on
PostgreSQL in the default run and on every database with ``OUTBOX_FULL_RUN=1``.

The tables are created by the first test of each database and emptied of rows before every
later one, as in the database conformance suite: the same empty tables at a fraction of the
cost, so that the suite takes seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete

from outbox import Outbox, Settings, schema
from tests.conftest import FULL_RUN_ENV, reset_schema
from tests.executors import _processes
from tests.executors._executors import EXECUTORS, Executor
from tests.executors._processes import REDIS_URL
from tests.models import Base

DATABASES = ("sqlite", "postgresql", "mariadb")
DEFAULT_RUN_ONLY_ON = {"celery": ("postgresql",)}
"""Executors that run on fewer databases in the default run: slow to start, and the database's
part of what they do is the same code as the native worker's."""
CASES = [
    (executor, database)
    for executor in sorted(EXECUTORS)
    for database in DATABASES
    if os.environ.get(FULL_RUN_ENV) == "1"
    or database in DEFAULT_RUN_ONLY_ON.get(executor, DATABASES)
]
_TABLES = [*schema.metadata.sorted_tables, *Base.metadata.sorted_tables]


@pytest.fixture(scope="session")
def _created() -> set[str]:
    """The databases whose tables this session has created."""
    return set()


@pytest.fixture(scope="session")
def _sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("executors") / "outbox.sqlite3"
    return f"sqlite:///{path}"


@pytest.fixture(params=CASES, ids=[f"{e}-{d}" for e, d in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    """An executor and a database to run it on."""
    executor, database = request.param
    return executor, database


@pytest.fixture
def database(case: tuple[str, str], request: pytest.FixtureRequest, _created: set[str]) -> str:
    """The URL of a migrated database of the case's kind, its tables empty."""
    name = {"sqlite": "_sqlite_url", "postgresql": "postgres_url", "mariadb": "mariadb_url"}
    url: str = request.getfixturevalue(name[case[1]])
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


@pytest.fixture
def executor(case: tuple[str, str]) -> Iterator[Executor]:
    """The case's executor, stopped after the test."""
    running = EXECUTORS[case[0]]()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def processes(tmp_path: Path, postgres_database: str) -> Iterator[_processes.Celery]:
    """The test's Celery processes (a worker, a beat) on PostgreSQL and Redis, not started
    yet."""
    running = _processes.new(tmp_path, postgres_database, REDIS_URL)
    yield running
    running.stop()
