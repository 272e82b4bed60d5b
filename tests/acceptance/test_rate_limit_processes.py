"""A rate limit holds across processes: ``outbox work --processes 8`` on a handler limited to
18 calls a second never starts more than 20 batches in any second (a downstream allowing 20
never refuses one), and every event is handled once. On PostgreSQL and MariaDB, through the
real command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tests.acceptance._cli import APP, LEASE, Cli, handled_ids, started
from tests.acceptance.cli_app import BATCH_SIZE_ENV, CALLS_PER_SECOND_ENV
from tests.integration.test_rate_limits import most_in_any_window


def test_eight_processes_together_keep_to_the_limit(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    ids = commit_events(connect(server_database), 60)
    result = cli.run(
        "--app", APP, "--database-url", server_database, "work", *LEASE,
        "--burst", "--processes", "8", "--concurrency", "2", "--handler", "record_activity",
        env={CALLS_PER_SECOND_ENV: "18", BATCH_SIZE_ENV: "1"},
    )  # fmt: skip
    starts = [float(line.value) for line in started(output_dir)]
    pids = {line.pid for line in started(output_dir)}
    assert (0, sorted(ids), True) == (result.code, handled_ids(output_dir), len(pids) > 1)
    assert most_in_any_window(starts, [1] * len(starts)) <= 20
    assert max(starts) - min(starts) >= 59 / 18
