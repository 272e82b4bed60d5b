"""Fixtures of the acceptance tier: the ``outbox`` command in subprocesses, on real databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from tests.acceptance._cli import Cli
from tests.conftest import DEFAULT_POSTGRES_URL, POSTGRES_URL_ENV


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    """Where the test application's handlers record what they did."""
    path = tmp_path / "handlers"
    path.mkdir()
    return path


@pytest.fixture
def cli(tmp_path: Path, output_dir: Path) -> Iterator[Cli]:
    """Runs ``outbox`` commands; any still running when the test ends are killed."""
    runner = Cli(tmp_path, output_dir)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def connect() -> Iterator[Callable[[str], Engine]]:
    """Engines on a URL, for the test to write events and look at tables; disposed after."""
    engines: list[Engine] = []

    def make(url: str) -> Engine:
        engine = create_engine(url)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture
def empty_postgres_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database with no tables at all, dropped after the test."""
    admin_url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    name = f"outbox_empty_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of each kind with no tables at all."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("empty_postgres_url")
        return url
    return f"sqlite:///{tmp_path}/empty.sqlite3"
