"""``outbox work`` on a schema it may not work on: one line, exit 1, at start and while running.

Some tests flip ``outbox_schema`` as a migration of a later release would: it asks for workers
of a newer generation than this outbox's. Others take the tables back with the real ``outbox
migrate --to``, under a running worker or before one starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, update

from outbox import schema
from outbox._core import log as _log
from outbox._core.version import VERSION
from outbox.ops.migrate import alembic_config
from tests._support import wait_for
from tests.acceptance._cli import APP, Cli, handled_ids, start_work
from tests.acceptance.cli_app import SLEEP_ENV
from tests.models import Base

pytestmark = pytest.mark.timeout(90)

NEWER = schema.GENERATION + 1
NEWER_RELEASE = "9.0.0"
TOO_NEW = (
    f"Error: the database's outbox schema is at generation {NEWER} (migrated by outbox "
    f"{NEWER_RELEASE}) and needs workers of generation {NEWER} or newer; this worker (outbox "
    f"{VERSION}) understands generation {schema.GENERATION}: upgrade it"
)


# A backlog that keeps the worker handling (and counting) for about ten seconds.
BACKLOG = 1000
BATCH_SECONDS = "0.2"
# Far longer than a heartbeat of the tests' two-second lease.
STOP_TIMEOUT_SECONDS = 30.0
OLDER = 5
DOWNGRADED = (
    f"Error: the database's outbox schema is at generation {OLDER} and outbox {VERSION} needs "
    f"generation {schema.GENERATION}: run `outbox migrate` to upgrade it, or run the outbox "
    "version it belongs to"
)
BEFORE_GENERATIONS = (
    "Error: the database's outbox schema records no generation (outbox_schema is gone): it was "
    f"downgraded below generation {OLDER} and this worker (outbox {VERSION}) understands "
    f"generation {schema.GENERATION}; run workers of the outbox version the tables belong to, or "
    "`outbox migrate` to upgrade them"
)


@pytest.fixture
def migrated_url(cli: Cli, empty_database_url: str) -> str:
    """A database migrated by ``outbox migrate`` to this outbox's head, with the test
    application's buffer tables."""
    assert 0 == cli.run("--database-url", empty_database_url, "migrate").code
    engine = create_engine(empty_database_url)
    Base.metadata.create_all(engine)
    engine.dispose()
    return empty_database_url


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
        "outbox_attempts, outbox_operations, outbox_ingest_keys, outbox_inbox, outbox_throughput, "
        "outbox_schema"
    )
    expected = [f"Error: outbox tables missing: {missing}; run `outbox migrate` to create them"]
    assert (1, expected) == (result.code, result.stderr.splitlines())


@pytest.mark.parametrize(
    ("revision", "expected"),
    [("0005", DOWNGRADED), ("0004", BEFORE_GENERATIONS)],
    ids=["to-0005", "to-0004"],
)
def test_running_work_stops_in_one_line_once_migrate_takes_the_tables_back(
    cli: Cli,
    migrated_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
    revision: str,
    expected: str,
) -> None:
    """`outbox migrate --to 0005 --yes` (or 0004) under a worker busy with a backlog: its next
    throughput write fails (the table is gone) before it looks at the schema; it stops
    claiming all the same, says why once in the log and once on stderr (the generation it
    found: the target's, or one the downgrade was passing through), and exits 1."""
    commit_events(connect(migrated_url), BACKLOG)
    worker = start_work(cli, migrated_url, "-c", "2", env={SLEEP_ENV: BATCH_SECONDS})
    wait_for(lambda: handled_ids(output_dir), "the first events to be handled")
    downgrade = cli.run("--database-url", migrated_url, "migrate", "--to", revision, "--yes")
    assert 0 == downgrade.code, downgrade.stderr
    result = worker.result(timeout=STOP_TIMEOUT_SECONDS)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    logged = _logged(result.stderr, _log.WORKER_SCHEMA_INCOMPATIBLE)
    failed = [
        r["error"]
        for event in (_log.WORKER_DATABASE_ERROR, _log.WORKER_LOOP_ERROR)
        for r in _logged(result.stderr, event)
    ]
    # The downgrade takes the migrations back one at a time, each in a transaction of its own:
    # a worker that looks while it is under way finds a generation between the two, and says
    # that one, in the same words.
    passing = [
        DOWNGRADED.replace(f"generation {OLDER} ", f"generation {n} ", 1)
        for n in range(OLDER + 1, schema.GENERATION)
    ]
    said = errors[0] if len(errors) == 1 and errors[0] in passing else expected
    assert (1, [said], [said.removeprefix("Error: ")], []) == (
        result.code,
        errors,
        [r["reason"] for r in logged],
        failed,
    )


def test_work_on_tables_taken_back_a_generation_names_both_generations(
    cli: Cli, migrated_url: str
) -> None:
    """Tables taken back to 0005 by `outbox migrate --to`: a fresh `outbox work` exits 1 with
    one line naming the generation it found and the one it needs."""
    downgrade = cli.run("--database-url", migrated_url, "migrate", "--to", "0005", "--yes")
    assert 0 == downgrade.code, downgrade.stderr
    result = cli.run("--app", APP, "--database-url", migrated_url, "work", "--burst")
    assert (1, [DOWNGRADED]) == (result.code, result.stderr.splitlines())
