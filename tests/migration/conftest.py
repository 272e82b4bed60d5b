"""Fixtures of the migration tier: databases with no table at all, one per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

from tests.acceptance._cli import Cli
from tests.conftest import (
    DEFAULT_MARIADB_URL,
    DEFAULT_POSTGRES_URL,
    MARIADB_URL_ENV,
    POSTGRES_URL_ENV,
    _unavailable,
)


@contextmanager
def empty_databases(prefix: str, sqlite_dir: Callable[[], Path]) -> Iterator[Callable[[str], str]]:
    """Factory: the URL of a new database of a kind (sqlite, postgresql, mariadb) with no
    table, named ``prefix`` and a random suffix; the server databases are dropped at the end.
    A server that cannot be reached fails the test under CI, skips it elsewhere."""
    drops: list[Callable[[], None]] = []

    def make(kind: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        if kind == "sqlite":
            return f"sqlite:///{sqlite_dir()}/{name}.sqlite3"
        if kind == "postgresql":
            server = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
            create = f'CREATE DATABASE "{name}"'
            drop = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        else:
            server = make_url(os.environ.get(MARIADB_URL_ENV, DEFAULT_MARIADB_URL))
            create = f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"
            drop = f"DROP DATABASE IF EXISTS `{name}`"
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(create)
        except Exception as error:
            admin.dispose()
            _unavailable(f"{kind} at {server.host}:{server.port}", error)

        def drop_database() -> None:
            with admin.connect() as conn:
                conn.exec_driver_sql(drop)
            admin.dispose()

        drops.append(drop_database)
        return server.set(database=name).render_as_string(hide_password=False)

    try:
        yield make
    finally:
        for drop_database in drops:
            drop_database()


@pytest.fixture
def make_empty_database(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Factory: the URL of a new database of a kind (sqlite, postgresql, mariadb) with no
    table; the server databases are dropped after the test."""
    with empty_databases("outbox_mig", lambda: tmp_path) as make:
        yield make


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def empty_url(request: pytest.FixtureRequest, make_empty_database: Callable[[str], str]) -> str:
    """A database of each kind with no table at all."""
    return make_empty_database(request.param)


@pytest.fixture(params=["postgresql", "mariadb"])
def empty_server_url(
    request: pytest.FixtureRequest, make_empty_database: Callable[[str], str]
) -> str:
    """A database on each server (PostgreSQL, MariaDB) with no table at all."""
    return make_empty_database(request.param)


@pytest.fixture
def engine_on() -> Iterator[Callable[[str], Engine]]:
    """Engines on URLs, disposed after the test."""
    engines: list[Engine] = []

    def make(url: str) -> Engine:
        engine = create_engine(url)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """Runs ``outbox`` commands; any still running when the test ends are killed."""
    output = tmp_path / "handlers"
    output.mkdir()
    runner = Cli(tmp_path, output)
    try:
        yield runner
    finally:
        runner.close()
