"""``outbox work`` on an application whose handler is ``async def``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.acceptance import _tables
from tests.acceptance._cli import LEASE, Cli, handled, handled_ids
from tests.acceptance.cli_app import SLEEP_ENV

ASYNC_APP = "tests.acceptance.async_app:app"
HANDLER = "push_activity"


def test_work_burst_runs_an_async_handler_for_every_event(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """``work --burst`` with an async handler: exit 0, each event handled once, buffer empty."""
    engine = connect(database_url)
    ids = commit_events(engine, 25)

    result = cli.run("--app", ASYNC_APP, "--database-url", database_url, "work", "--burst")

    assert (0, ids, []) == (
        result.code,
        handled_ids(output_dir, HANDLER),
        _tables.buffer_rows(engine),
    ), result.output


@pytest.mark.postgres
def test_forked_workers_each_run_async_handlers_on_a_loop_of_their_own(
    cli: Cli,
    postgres_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """``--processes 2``: both forked workers run the async handler; each event once."""
    engine = connect(postgres_database)
    ids = commit_events(engine, 40)

    result = cli.run(
        "--app", ASYNC_APP, "--database-url", postgres_database, "work", *LEASE,
        "--burst", "--processes", "2", "--concurrency", "1",
        env={SLEEP_ENV: "0.5"},
    )  # fmt: skip

    assert (0, ids, 2) == (
        result.code,
        handled_ids(output_dir, HANDLER),
        len({line.pid for line in handled(output_dir)}),
    ), result.output
