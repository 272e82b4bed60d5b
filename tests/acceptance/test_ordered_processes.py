"""Ordered keys across processes: ``outbox work --processes 4`` on a handler with an ordering
key, a third of its calls failing at random: every key's events reach the downstream in id
order, each once. Real commands, on PostgreSQL and MariaDB."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import Cli, handled, start_work
from tests.acceptance.cli_app import (
    BATCH_SIZE_ENV,
    FAIL_ENV,
    MAX_ATTEMPTS_ENV,
    ORDERED_ENV,
    SLEEP_ENV,
)

KEYS = 8
EVENTS = 160


def test_four_processes_keep_every_keys_order_through_failures(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    engine = connect(server_database)
    ids_by_key: dict[int, list[int]] = {}
    for n in range(EVENTS):
        (event_id,) = commit_events(engine, 1, activity_id=n % KEYS)
        ids_by_key.setdefault(n % KEYS, []).append(event_id)
    # Each batch holds its thread a little: eight keys' groups at a time then need more than one
    # process's two threads, so that the run shows order kept across processes (on a loaded
    # machine, one process could otherwise take every group as it comes).
    env = {
        ORDERED_ENV: "1",
        FAIL_ENV: "0.3",
        MAX_ATTEMPTS_ENV: "50",
        BATCH_SIZE_ENV: "5",
        SLEEP_ENV: "0.05",
    }
    work = start_work(
        cli, server_database, "--processes", "4", "--concurrency", "2",
        "--handler", "record_activity", "--distribute-every", "0.2",
        # Polled often: behind a pooler nothing is notified, and four workers' coordinated
        # polling of the tests' 0.2 s would leave three asleep while the fourth drains it all.
        "--poll-interval", "0.05", env=env,
    )  # fmt: skip

    wait_for(lambda: _tables.buffer_is_empty(engine), "the buffer to drain", timeout=180)
    work.send(signal.SIGTERM)
    stopped = work.wait(60)
    key_of = {event_id: key for key, ids in ids_by_key.items() for event_id in ids}
    seen: dict[int, list[int]] = {}
    for line in handled(output_dir):  # in the order the handlers wrote them
        seen.setdefault(key_of[int(line.value)], []).append(int(line.value))
    pids = {line.pid for line in handled(output_dir)}
    assert (0, ids_by_key, True) == (stopped, dict(sorted(seen.items())), len(pids) > 1)
