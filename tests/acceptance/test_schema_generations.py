"""``outbox work`` on a schema it may not work on: one line, exit 1, at start and while running.

The test flips ``outbox_schema`` as a migration of a later release would: it asks for workers of
a newer generation than this outbox's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, update

from outbox import _log, schema
from outbox._version import VERSION
from outbox.migrate import alembic_config
from tests._support import wait_for
from tests.acceptance._cli import APP, Cli, handled_ids, start_work

pytestmark = pytest.mark.timeout(90)

NEWER = schema.GENERATION + 1
NEWER_RELEASE = "9.0.0"
TOO_NEW = (
    f"Error: the database's outbox schema is at generation {NEWER} (migrated by outbox "
    f"{NEWER_RELEASE}) and needs workers of generation {NEWER} or newer; this worker (outbox "
    f"{VERSION}) understands generation {schema.GENERATION}: upgrade it"
)


def _needs_newer_workers(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(schema.schema_state).values(
                generation=NEWER, workers_from=NEWER, migrated_by=NEWER_RELEASE
            )
        )


def _logged(stderr: str, event: str) -> list[dict[str, Any]]:
    found = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


@pytest.mark.parametrize("processes", ["1", "2"])
def test_work_stops_and_exits_1_in_one_line_once_the_schema_needs_newer_workers(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
    processes: str,
) -> None:
    """A running `outbox work` finishes its work, logs why and exits 1 with the line."""
    engine = connect(database_url)
    ids = commit_events(engine, 3)
    worker = start_work(cli, database_url, "--processes", processes)
    wait_for(lambda: handled_ids(output_dir) == ids, "the events to be handled")
    _needs_newer_workers(engine)
    result = worker.result()
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    logged = _logged(result.stderr, _log.WORKER_SCHEMA_INCOMPATIBLE)
    assert (1, [TOO_NEW] * int(processes)) == (result.code, errors)
    assert [(NEWER, NEWER, schema.GENERATION)] * int(processes) == [
        (r["schema_generation"], r["workers_from"], r["worker_generation"]) for r in logged
    ]


def test_work_refuses_to_start_on_a_schema_that_needs_newer_workers(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Exit 1 and one line on stderr, naming both generations."""
    _needs_newer_workers(connect(database_url))
    result = cli.run("--app", APP, "--database-url", database_url, "work", "--burst")
    assert (1, [TOO_NEW]) == (result.code, result.stderr.splitlines())


def test_work_on_tables_from_before_generations_says_to_migrate_in_one_line(
    cli: Cli, empty_database_url: str
) -> None:
    """Tables at 0004 (no outbox_schema, none of 0006's): exit 1 and the one line that says to
    migrate, naming the tables missing."""
    engine = create_engine(empty_database_url)
    command.upgrade(alembic_config(engine), "0004")
    engine.dispose()
    result = cli.run("--app", APP, "--database-url", empty_database_url, "work", "--burst")
    missing = (
        "outbox_attempts, outbox_operations, outbox_ingest_keys, outbox_throughput, outbox_schema"
    )
    expected = [f"Error: outbox tables missing: {missing}; run `outbox migrate` to create them"]
    assert (1, expected) == (result.code, result.stderr.splitlines())
