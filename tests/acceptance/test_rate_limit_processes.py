"""A rate limit holds across processes: ``outbox work --processes 8`` on a handler limited to
18 calls a second never starts more than 18 batches in any second, counted at the handler's
entry in every process, and every event is handled once; so do four processes under a calls
or an events limit. On PostgreSQL and MariaDB, through the real command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.acceptance._cli import APP, Cli, handled, handled_ids, started
from tests.acceptance.cli_app import BATCH_SIZE_ENV, CALLS_PER_SECOND_ENV, RATE_LIMIT_ENV
from tests.integration.test_rate_limits import most_in_any_window

# A worker holds a group for its turn up to a third of the lease: with 6 s, a turn a window
# away is waited for rather than put back, which a burst worker would leave behind.
HOLDING_LEASE = ("--lease", "6", "--poll-interval", "0.2")


def test_eight_processes_together_keep_to_the_limit(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    ids = commit_events(connect(server_database), 60)
    result = cli.run(
        "--app", APP, "--database-url", server_database, "work", *HOLDING_LEASE,
        "--burst", "--processes", "8", "--concurrency", "2", "--handler", "record_activity",
        env={CALLS_PER_SECOND_ENV: "18", BATCH_SIZE_ENV: "1"},
    )  # fmt: skip
    starts = [float(line.value) for line in started(output_dir)]
    pids = {line.pid for line in started(output_dir)}
    assert (0, sorted(ids), True) == (result.code, handled_ids(output_dir), len(pids) > 1)
    assert most_in_any_window(starts, [1] * len(starts)) <= 18
    # Sixty calls need four windows: the last starts three periods after the first.
    assert max(starts) - min(starts) >= 3.0


@pytest.mark.parametrize(
    ("limit", "batch_size", "events", "most"),
    [
        ("calls_per_second=10", 1, 40, 10),
        ("calls_per_second=10,burst=5", 1, 40, 10),
        ("events_per_second=20,event_burst=8", 4, 40, 20),
    ],
    ids=["calls", "calls-burst", "events-burst"],
)
def test_no_window_of_four_processes_holds_more_than_the_limit(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
    limit: str,
    batch_size: int,
    events: int,
    most: int,
) -> None:
    """Counted at the handler's entry in every process (its groups' sizes for the events
    limit): no one-second window holds more than the limit, evenly spaced or in bursts."""
    ids = commit_events(connect(server_database), events)
    result = cli.run(
        "--app", APP, "--database-url", server_database, "work", *HOLDING_LEASE,
        "--burst", "--processes", "4", "--concurrency", "3", "--handler", "record_activity",
        env={RATE_LIMIT_ENV: limit, BATCH_SIZE_ENV: str(batch_size)},
    )  # fmt: skip
    lines = started(output_dir)
    starts = [float(line.value) for line in lines]
    sizes = {line.group_id: 0 for line in lines}
    for line in handled(output_dir):
        sizes[line.group_id] += 1
    weights = [1 if batch_size == 1 else sizes[line.group_id] for line in lines]
    assert (0, sorted(ids)) == (result.code, handled_ids(output_dir))
    assert most_in_any_window(starts, weights) <= most
