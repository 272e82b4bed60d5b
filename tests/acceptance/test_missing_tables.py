"""A buffer table that does not exist: every command says which, and for which handler, in one line.

The test application has two handlers, ``record_activity`` (table ``test_activity_events``) and
``record_email`` (table ``test_email_events``); here the second table is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests._support import wait_for
from tests.acceptance._cli import APP, Cli, handled_ids, start_work, started
from tests.models import EmailEvent

EXIT_FAILURE = 1
# Long enough for a worker's start-up and a burst of a few batches; a worker that waits for a
# table forever runs into it.
COMMAND_TIMEOUT_SECONDS = 30.0

COMMANDS = [
    ["distribute"],
    ["work", "--burst"],
    ["work", "--burst", "--processes", "2"],
    ["work"],
    ["status"],
    ["status", "--json"],
    ["check"],
    ["replay"],
    ["replay", "--handler", "record_email"],
    ["reindex"],
    ["notify", "install"],
    ["notify", "remove"],
]


@pytest.fixture
def missing_email_table(database_url: str, connect: Callable[[str], Engine]) -> str:
    """A migrated database whose ``test_email_events`` buffer table does not exist."""
    EmailEvent.__table__.drop(connect(database_url))
    return database_url


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_command_with_a_buffer_table_missing_exits_1_naming_table_and_handler(
    cli: Cli, missing_email_table: str, command: list[str]
) -> None:
    """The command exits 1 with one line naming the table and its handler, no traceback."""
    result = cli.run(
        "--app", APP, "--database-url", missing_email_table, *command,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )  # fmt: skip

    line = result.stderr.strip()
    assert (EXIT_FAILURE, 1, True, True, False) == (
        result.code,
        len(result.stderr.splitlines()),
        "buffer table 'test_email_events' of handler 'record_email' does not exist" in line,
        "create it with the application's migrations" in line,
        "Traceback" in result.output,
    )


def test_work_with_a_buffer_table_missing_names_the_handlers_that_can_run(
    cli: Cli, missing_email_table: str
) -> None:
    """The refusal names ``--handler`` for the handlers whose tables exist."""
    result = cli.run(
        "--app", APP, "--database-url", missing_email_table, "work", "--burst",
        timeout=COMMAND_TIMEOUT_SECONDS,
    )  # fmt: skip

    assert "--handler record_activity" in result.stderr


def test_work_burst_of_the_other_handlers_runs_while_a_buffer_table_is_missing(
    cli: Cli,
    missing_email_table: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """``work --burst --handler record_activity`` handles its events and exits 0."""
    ids = commit_events(connect(missing_email_table), 25)

    result = cli.run(
        "--app", APP, "--database-url", missing_email_table, "work", "--burst",
        "--handler", "record_activity", timeout=COMMAND_TIMEOUT_SECONDS,
    )  # fmt: skip

    assert (0, ids) == (result.code, handled_ids(output_dir))


def test_work_burst_with_a_buffer_table_dropped_mid_run_ends_after_handling_the_others(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """A table dropped mid-run: the other handler's events are all handled, the burst ends
    with exit 1 naming the table, and the worker logged it once, not as an outage."""
    engine = connect(database_url)
    activity = commit_events(engine, 60)
    commit_events(engine, 60, EmailEvent)
    worker = start_work(
        cli, database_url, "--burst", "-c", "2", env={"OUTBOX_TEST_SLEEP_SECONDS": "0.2"}
    )
    wait_for(lambda: started(output_dir), "the first batch to start")

    EmailEvent.__table__.drop(engine)
    result = worker.result(timeout=COMMAND_TIMEOUT_SECONDS)

    log = result.stderr
    last_line = log.rstrip().splitlines()[-1]
    assert (EXIT_FAILURE, activity, 1, 0, True) == (
        result.code,
        handled_ids(output_dir),
        log.count("outbox.worker.buffer_table_missing"),
        log.count("outbox.worker.database_error"),
        last_line.startswith(
            "Error: buffer table 'test_email_events' of handler 'record_email' does not exist"
        ),
    )
