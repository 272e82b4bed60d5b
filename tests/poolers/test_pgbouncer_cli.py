"""The ``outbox`` command through PgBouncer in transaction mode: migrate, distribute, work with
a worker killed mid-batch, status. Each command gets the PgBouncer's URL and nothing else."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect

from outbox import schema
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli, handled_ids, start_work, started
from tests.acceptance.cli_app import SLEEP_ENV
from tests.poolers._pgbouncer import PgBouncer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

SLOW = {SLEEP_ENV: "30"}
"""A batch that takes far longer than the test: it only ends by a signal."""


def test_migrate_through_the_pooler_creates_the_outbox_tables(
    cli: Cli, empty_pooled_url: str, postgres_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox migrate`` through PgBouncer exits 0 and creates the three tables."""
    result = cli.run("--database-url", empty_pooled_url, "migrate")

    existing = set(inspect(connect(postgres_url)).get_table_names())
    assert (0, set(schema.TABLE_NAMES)) == (result.code, set(schema.TABLE_NAMES) & existing)


def test_distribute_through_the_pooler_enqueues_claim_jobs(
    cli: Cli,
    pgbouncer: PgBouncer,
    postgres_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
) -> None:
    """25 events, batch size 10: ``outbox distribute`` through PgBouncer enqueues 3 claim jobs."""
    engine = connect(postgres_database)
    commit_events(engine, 25)

    result = cli.run("--app", APP, "--database-url", pgbouncer.url, "distribute")

    claims = Counter(job["handler"] for job in _tables.jobs(engine) if job["kind"] == "claim")
    assert (0, {"record_activity": 3}) == (result.code, claims)


def test_status_through_the_pooler_reports_the_unclaimed_events(
    cli: Cli,
    pgbouncer: PgBouncer,
    postgres_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
) -> None:
    """``outbox status --json`` through PgBouncer counts the events waiting in each buffer."""
    commit_events(connect(postgres_database), 7)

    result = cli.run("--app", APP, "--database-url", pgbouncer.url, "status", "--json")

    unclaimed = {h["handler"]: h["unclaimed"] for h in json.loads(result.stdout)["handlers"]}
    assert (0, {"record_activity": 7, "record_email": 0}) == (result.code, unclaimed)


def test_a_worker_killed_behind_the_pooler_loses_nothing_and_only_its_group_runs_twice(
    cli: Cli,
    pooled_url: str,
    postgres_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGKILL mid-batch, then a second worker, all through PgBouncer: every event handled
    once, the killed group started twice (attempts 1 and 2), every other group once."""
    engine = connect(postgres_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", pooled_url, "distribute")
    doomed = start_work(cli, pooled_url, "--concurrency", "1", env=SLOW)
    killed = wait_for(lambda: started(output_dir), "a batch to start")[0]

    doomed.send(signal.SIGKILL)
    doomed.wait(timeout=10)
    rescuer = start_work(cli, pooled_url, "--concurrency", "2")
    wait_for(lambda: handled_ids(output_dir) == ids, "every event handled", timeout=45)
    rescuer.send(signal.SIGTERM)
    code = rescuer.wait(timeout=15)

    starts = Counter(line.group_id for line in started(output_dir))
    others = [count for group, count in starts.items() if group != killed.group_id]
    assert (0, ids, [1, 2], [1, 1], [], []) == (
        code,
        handled_ids(output_dir),
        sorted(line.attempt for line in started(output_dir) if line.group_id == killed.group_id),
        others,
        _tables.buffer_rows(engine),
        _tables.jobs(engine),
    )
