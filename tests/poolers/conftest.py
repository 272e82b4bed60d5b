"""Fixtures of the pooler tier: outbox through a real PgBouncer in transaction mode.

Two PgBouncers serve the session's PostgreSQL database: one as configured by default, which
refuses the ``options`` startup parameter, and one with ``ignore_startup_parameters = options``,
which accepts it and drops it. When ``pgbouncer`` is not installed the tests are skipped on a
developer's machine and fail when ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from tests.acceptance._cli import Cli
from tests.conftest import pgbouncer_program
from tests.poolers._pgbouncer import PgBouncer

REFUSES = "refuses-options"
IGNORES = "ignores-options"


def _started(program: str, url: str, directory: Path, *, ignore_options: bool) -> PgBouncer:
    bouncer = PgBouncer(program, url, directory, ignore_options=ignore_options)
    bouncer.start()
    return bouncer


@pytest.fixture(scope="session")
def pgbouncer_ignoring_options(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode with ``ignore_startup_parameters = options``."""
    bouncer = _started(
        pgbouncer_program(), postgres_url, tmp_path_factory.mktemp("pgbouncer"), ignore_options=True
    )
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(params=[REFUSES, IGNORES])
def pooled_url(request: pytest.FixtureRequest, postgres_database: str) -> str:
    """The session's database, reset to empty tables, through each PgBouncer."""
    name = "pgbouncer" if request.param == REFUSES else "pgbouncer_ignoring_options"
    bouncer: PgBouncer = request.getfixturevalue(name)
    return bouncer.url


@pytest.fixture
def empty_pooled_url(postgres_url: str, pgbouncer: PgBouncer) -> str:
    """The session's database with no tables at all, through the PgBouncer refusing options."""
    admin = create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    admin.dispose()
    return pgbouncer.url


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
