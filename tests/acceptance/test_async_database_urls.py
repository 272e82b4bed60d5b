"""The ``outbox`` command given an async driver's database URL: it runs on the sync sibling."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect
from sqlalchemy.engine import make_url

from outbox import schema
from tests.acceptance._cli import APP, LEASE, Cli, handled_ids
from tests.models import Base

ASYNC_DRIVERS = {"asyncpg": "postgresql+asyncpg", "aiosqlite": "sqlite+aiosqlite"}


@dataclass(frozen=True)
class Database:
    """An empty database, by its sync URL and by an async driver's URL."""

    url: str
    async_url: str


@pytest.fixture(params=list(ASYNC_DRIVERS))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """An empty database with no tables, reached through each async driver."""
    if request.param == "asyncpg":
        url: str = request.getfixturevalue("empty_postgres_url")
    else:
        url = f"sqlite:///{tmp_path}/empty.sqlite3"
    async_url = make_url(url).set(drivername=ASYNC_DRIVERS[request.param])
    return Database(url, async_url.render_as_string(hide_password=False))


@pytest.fixture
def migrated(cli: Cli, database: Database, connect: Callable[[str], Engine]) -> Engine:
    """The database migrated by ``outbox migrate`` on its async URL, with the test buffers."""
    result = cli.run("--database-url", database.async_url, "migrate")
    assert 0 == result.code, result.output
    engine = connect(database.url)
    Base.metadata.create_all(engine)
    return engine


def test_migrate_on_an_async_url_creates_the_outbox_tables(
    cli: Cli, database: Database, connect: Callable[[str], Engine]
) -> None:
    """``outbox --database-url <async URL> migrate`` creates outbox's tables and exits 0."""
    result = cli.run("--database-url", database.async_url, "migrate")

    created = set(schema.TABLE_NAMES) & set(inspect(connect(database.url)).get_table_names())
    assert (0, set(schema.TABLE_NAMES)) == (result.code, created)


def test_status_on_an_async_url_counts_unclaimed_events(
    cli: Cli, database: Database, migrated: Engine, commit_events: Any
) -> None:
    """``outbox status`` on an async URL reports the events waiting in each buffer."""
    commit_events(migrated, 5)

    result = cli.run("--app", APP, "--database-url", database.async_url, "status", "--json")

    unclaimed = {h["handler"]: h["unclaimed"] for h in json.loads(result.stdout)["handlers"]}
    assert (0, 5) == (result.code, unclaimed.get("record_activity"))


def test_work_on_an_async_url_handles_every_event(
    cli: Cli, database: Database, migrated: Engine, commit_events: Any, output_dir: Path
) -> None:
    """``outbox work --burst`` on an async URL hands every committed event to its handler."""
    ids = commit_events(migrated, 25)

    result = cli.run("--app", APP, "--database-url", database.async_url, "work", *LEASE, "--burst")

    assert (0, ids) == (result.code, handled_ids(output_dir))


@pytest.mark.parametrize("database", ["asyncpg"], indirect=True)
def test_an_async_url_in_the_environment_is_used_the_same_way(
    cli: Cli, database: Database, migrated: Engine, commit_events: Any
) -> None:
    """An async URL in OUTBOX_DATABASE_URL runs on the sync sibling too."""
    commit_events(migrated, 2)

    result = cli.run(
        "--app", APP, "status", "--json", env={"OUTBOX_DATABASE_URL": database.async_url}
    )

    unclaimed = {h["handler"]: h["unclaimed"] for h in json.loads(result.stdout)["handlers"]}
    assert (0, 2) == (result.code, unclaimed.get("record_activity"))


def test_an_unknown_async_driver_is_refused_in_one_line(cli: Cli) -> None:
    """An async driver outbox knows no sync sibling of: exit 2 and one line saying what to do."""
    result = cli.run("--database-url", "mssql+aioodbc://app:s3cret@db/shop", "migrate")

    expected = (
        "Error: --database-url: outbox runs on a sync driver and knows none for the async "
        "'mssql+aioodbc': give outbox a sync URL (postgresql+psycopg://, sqlite:///, "
        "mysql+pymysql://) or Outbox(engine=create_engine(...))"
    )
    assert (2, [expected]) == (result.code, result.stderr.strip().splitlines())
