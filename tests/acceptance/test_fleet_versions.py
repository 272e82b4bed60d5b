"""The fleet's versions: ``status`` shows them, ``pause``/``resume`` and ``check`` warn while
workers too old for a lever are alive. Real commands, on every database.

Workers of an older outbox are rows as it writes them: no version, no generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert

from outbox import schema
from outbox._core.version import VERSION
from outbox.ops.fleet import NO_VERSION
from tests._support import wait_for
from tests.acceptance._cli import APP, Cli, handled_ids, start_work
from tests.acceptance.cli_app import CALLS_PER_SECOND_ENV

OLD_WORKERS = (
    "warning: 2 live workers record no version (older than outbox 0.2): workers older than "
    "schema 0003 ignore pauses; stop or upgrade them"
)


def _outbox(cli: Cli, url: str, *args: str) -> Any:
    return cli.run("--app", APP, "--database-url", url, *args)


def _old_workers(engine: Engine, count: int) -> None:
    """Live workers of an outbox older than 0.2: they record no version."""
    rows = [{"id": f"old:{n}", "hostname": "old", "pid": n, "concurrency": 1} for n in range(count)]
    with engine.begin() as conn:
        conn.execute(insert(schema.workers), rows)


def test_status_shows_the_live_workers_by_version(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """A running worker shows with its version and generation, the old ones as such."""
    engine = connect(database_url)
    ids = commit_events(engine, 1)
    start_work(cli, database_url)
    wait_for(lambda: handled_ids(output_dir) == ids, "the worker to run")
    _old_workers(engine, 2)
    document = json.loads(_outbox(cli, database_url, "status", "--json").stdout)
    text = _outbox(cli, database_url, "status").stdout
    expected = [
        {"version": None, "generation": None, "live": 2, "text": NO_VERSION},
        {"version": VERSION, "generation": schema.GENERATION, "live": 1, "text": VERSION},
    ]
    assert (schema.GENERATION, 1, expected) == (
        document["fleet"]["generation"],
        document["fleet"]["workers_from"],
        document["fleet"]["workers"],
    )
    assert [f"{NO_VERSION}  -           2", f"{VERSION:<36}  {schema.GENERATION:<10}  1"] == [
        line for line in text.splitlines() if line.startswith((NO_VERSION, VERSION))
    ]


def test_pause_warns_while_workers_older_than_pauses_are_alive(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """The pause is set, and stderr says which workers ignore it."""
    _old_workers(connect(database_url), 2)
    paused = _outbox(cli, database_url, "pause", "record_activity")
    assert (0, "paused record_activity until resumed (outbox resume record_activity)") == (
        paused.code,
        paused.stdout.strip(),
    )
    assert [OLD_WORKERS] == paused.stderr.splitlines()


def test_resume_warns_while_workers_older_than_pauses_are_alive(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Resumed, with the same warning."""
    _outbox(cli, database_url, "pause", "record_activity")
    _old_workers(connect(database_url), 2)
    resumed = _outbox(cli, database_url, "resume", "record_activity")
    assert (0, "resumed record_activity", [OLD_WORKERS]) == (
        resumed.code,
        resumed.stdout.strip(),
        resumed.stderr.splitlines(),
    )


def test_pause_says_nothing_more_when_every_live_worker_records_its_version(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """No old worker alive: no warning."""
    with connect(database_url).begin() as conn:
        conn.execute(
            insert(schema.workers).values(
                id="new:1", hostname="new", pid=1, concurrency=1, version="0.2.0", generation=5
            )
        )
    paused = _outbox(cli, database_url, "pause", "record_activity")
    assert (0, "") == (paused.code, paused.stderr)


def test_check_warns_of_old_workers_without_failing(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """A warning line naming what they ignore; the promises hold, so exit 0."""
    _old_workers(connect(database_url), 1)
    checked = _outbox(cli, database_url, "check")
    expected = [
        "warning: 1 live worker records no version (older than outbox 0.2): it may ignore "
        "pauses, circuit breakers, Retry-After pauses, ordering keys (since schema 0003), "
        "exact rate limits (since schema 0004) and requests to drain or stop (since schema "
        "0007); stop or upgrade it",
        "all promises hold",
    ]
    assert (0, expected) == (checked.code, checked.stdout.splitlines())


def _older_worker_warnings(stderr: str) -> list[str]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line["detail"] for line in lines if line["event"] == "outbox.worker.older_workers"]


def test_a_worker_with_a_rate_limit_warns_at_start_of_older_workers(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Its handlers keep a fleet-wide rate limit the older workers do not count: one line."""
    _old_workers(connect(database_url), 2)
    worked = cli.run(
        "--app", APP, "--database-url", database_url, "work", "--burst",
        env={CALLS_PER_SECOND_ENV: "100"},
    )  # fmt: skip
    expected = [
        "2 live workers record no version (older than outbox 0.2): workers older than schema "
        "0004 ignore exact rate limits, which handlers of this worker use; stop or upgrade them"
    ]
    assert (0, expected) == (worked.code, _older_worker_warnings(worked.stderr))


def test_a_worker_without_shared_levers_says_nothing_of_older_workers(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """No rate limit, breaker or ordering key: the older workers change nothing it keeps."""
    _old_workers(connect(database_url), 2)
    worked = cli.run("--app", APP, "--database-url", database_url, "work", "--burst")
    assert (0, []) == (worked.code, _older_worker_warnings(worked.stderr))
