"""``outbox distribute`` and ``outbox work --burst``, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli, handled
from tests.models import ActivityEvent, EmailEvent


def test_distribute_enqueues_claim_jobs_and_prints_a_line_per_handler(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """25 events, batch size 10: ceil(25 / 10) = 3 claim jobs; one summary line per handler."""
    engine = connect(database_url)
    commit_events(engine, 25)

    result = cli.run("--app", APP, "--database-url", database_url, "distribute")

    claims = Counter(job["handler"] for job in _tables.jobs(engine) if job["kind"] == "claim")
    lines = [line.split(":")[0] for line in result.stdout.splitlines()]
    assert (0, ["record_activity", "record_email"], {"record_activity": 3}) == (
        result.code,
        lines,
        claims,
    )


def test_work_burst_handles_every_event_once_leaves_nothing_and_exits(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """``work --burst`` exits 0, each event handled exactly once, buffers and jobs empty."""
    engine = connect(database_url)
    activity = commit_events(engine, 25)
    email = commit_events(engine, 7, EmailEvent)

    result = cli.run(
        "--app", APP, "--database-url", database_url, "work", "--burst", "--poll-interval", "0.2"
    )

    expected = [("record_activity", i) for i in activity] + [("record_email", i) for i in email]
    assert (0, Counter(expected), 0, 0, []) == (
        result.code,
        Counter((line.handler, int(line.value)) for line in handled(output_dir)),
        _tables.count(engine, ActivityEvent.__table__),
        _tables.count(engine, EmailEvent.__table__),
        _tables.jobs(engine),
    )
