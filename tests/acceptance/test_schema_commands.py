"""``outbox migrate`` and ``outbox schema sql``."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, inspect

from outbox import schema
from tests.acceptance._cli import Cli


def test_migrate_creates_the_outbox_tables(
    cli: Cli, empty_database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox migrate`` on an empty database creates the three tables and exits 0."""
    result = cli.run("--database-url", empty_database_url, "migrate")

    engine = connect(empty_database_url)
    assert (0, set(schema.TABLE_NAMES)) == (
        result.code,
        set(schema.TABLE_NAMES) & set(inspect(engine).get_table_names()),
    )


def test_migrate_twice_reports_up_to_date(cli: Cli, empty_database_url: str) -> None:
    """A second ``outbox migrate`` exits 0 and says the tables are up to date."""
    first = cli.run("--database-url", empty_database_url, "migrate")
    second = cli.run("--database-url", empty_database_url, "migrate")

    assert (0, 0, True) == (first.code, second.code, "up to date" in second.stdout)


def test_schema_sql_prints_create_table_for_every_outbox_table(cli: Cli) -> None:
    """``outbox schema sql`` prints a CREATE TABLE statement for each of outbox's tables."""
    result = cli.run("schema", "sql")

    created = set(re.findall(r"^CREATE TABLE (\w+) \(", result.stdout, flags=re.MULTILINE))
    expected = {
        "outbox_jobs",
        "outbox_archive",
        "outbox_workers",
        "outbox_handlers",
        "outbox_rate_limits",
        "outbox_held_keys",
        "outbox_schema",
        "outbox_attempts",
        "outbox_operations",
        "outbox_throughput",
        "outbox_ingest_keys",
        "outbox_inbox",
    }
    assert (0, expected) == (result.code, created)


def test_schema_sql_records_the_generation_its_tables_are(cli: Cli, tmp_path: Path) -> None:
    """Run by hand, the printed DDL leaves outbox_schema saying the newest generation, as a
    migration does."""
    result = cli.run("schema", "sql", "--dialect", "sqlite")
    database = tmp_path / "by_hand.sqlite3"
    with sqlite3.connect(database) as conn:
        conn.executescript(result.stdout)
        row = conn.execute("SELECT generation, workers_from FROM outbox_schema").fetchall()
    assert (0, [(schema.GENERATION, schema.WORKERS_FROM)]) == (result.code, row)
