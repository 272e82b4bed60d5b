"""``outbox work`` on its own: it distributes by itself, says when nothing distributes, and
brings back the groups of a worker that died long before their leases end.

The drain runs on SQLite, PostgreSQL and MariaDB; the SIGKILL on the two servers.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, update

from outbox._db.dialects import db_now_plus
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli, handled_ids, start_work, started
from tests.acceptance.cli_app import SLEEP_ENV, WORKER_STALE_AFTER_ENV
from tests.models import ActivityEvent

pytestmark = pytest.mark.timeout(60)

MISSING = "outbox.distribute.missing"
# Far past the two minutes after which waiting with no claim job raises the alert.
LONG_AGO_SECONDS = 600.0


def _date_back(engine: Engine, seconds: float) -> None:
    table = ActivityEvent.__table__
    with engine.begin() as conn:
        conn.execute(update(table).values(created_at=db_now_plus(-seconds)))


def test_work_with_no_flags_drains_the_buffer(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """No cron and no option: the worker distributes by itself and handles every event."""
    engine = connect(database_url)
    ids = commit_events(engine, 30)
    worker = start_work(cli, database_url)
    wait_for(lambda: handled_ids(output_dir) == ids, "every event handled", timeout=30)
    worker.send(signal.SIGTERM)
    assert (0, []) == (worker.wait(timeout=15), _tables.buffer_rows(engine))


def test_a_worker_that_leaves_distribution_to_cron_says_when_nothing_distributes(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """With --no-distribute and no cron, events that wait with no claim job are logged once,
    naming the handler and what to do; nothing is handled."""
    engine = connect(database_url)
    commit_events(engine, 5)
    _date_back(engine, LONG_AGO_SECONDS)
    worker = start_work(cli, database_url, "--no-distribute")
    wait_for(lambda: MISSING in worker.stderr(), "the warning", timeout=20)
    worker.send(signal.SIGTERM)
    worker.wait(timeout=15)
    (line,) = [line for line in worker.stderr().splitlines() if MISSING in line]
    assert (True, True, 5) == (
        "record_activity" in line,
        "outbox distribute" in line,
        len(_tables.buffer_rows(engine)),
    )


def test_status_and_check_alert_when_events_wait_with_no_claim_job(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """`check` exits 1 naming the handler, the wait and the remedy; `status --json` says how
    long the oldest event waited undistributed; after `outbox distribute` the alert is gone."""
    engine = connect(database_url)
    commit_events(engine, 5)
    _date_back(engine, LONG_AGO_SECONDS)
    base = ("--app", APP, "--database-url", database_url)
    check = cli.run(*base, "check", "--handler", "record_activity")
    status = json.loads(cli.run(*base, "status", "--json").stdout)
    (row,) = [h for h in status["handlers"] if h["handler"] == "record_activity"]
    cli.run(*base, "distribute")
    after = cli.run(*base, "status", "--json")
    (row_after,) = [
        h for h in json.loads(after.stdout)["handlers"] if h["handler"] == "record_activity"
    ]
    alert = "with no claim job: nothing distributes (run `outbox distribute` from cron"
    assert (1, True, True, True, None, []) == (
        check.code,
        "record_activity" in check.stdout and alert in check.stdout,
        row["undistributed_age"] > LONG_AGO_SECONDS - 5,
        any(alert in a for a in row["alerts"]),
        row_after["undistributed_age"],
        [a for a in row_after["alerts"] if "nothing distributes" in a],
    )


def test_no_distribute_and_distribute_every_exclude_each_other(cli: Cli, tmp_path: Path) -> None:
    """Both given: a usage error naming the option."""
    url = f"sqlite:///{tmp_path}/unused.sqlite3"
    result = cli.run(
        "--app", APP, "--database-url", url, "work", "--no-distribute", "--distribute-every", "5"
    )
    assert (2, True) == (result.code, "--no-distribute" in result.stderr)


def _status(cli: Cli, url: str, env: dict[str, str]) -> dict[str, Any]:
    result = cli.run("--app", APP, "--database-url", url, "status", "--json", env=env)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_a_killed_workers_groups_show_as_silent_and_come_back_long_before_the_lease_ends(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGKILL mid-batch with a 30 s lease: `status --json` shows the group held by the dead
    worker, silent, with when it will be rescued; a worker rescues it once the heartbeat says
    the holder is gone (a 3 s stale age), more than 15 s before the lease would have run out,
    and every event is delivered."""
    stale = {WORKER_STALE_AFTER_ENV: "3"}
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    doomed = start_work(
        cli, server_database, "--concurrency", "1", "--lease", "30", env={**stale, SLEEP_ENV: "30"}
    )
    killed = wait_for(lambda: started(output_dir), "a batch to start", timeout=20)[0]
    doomed.send(signal.SIGKILL)
    doomed.wait(timeout=10)
    group = uuid.UUID(killed.group_id)
    (job,) = [j for j in _tables.jobs(engine) if j["group_id"] == group]

    def shown() -> dict[str, Any] | None:
        for handler in _status(cli, server_database, stale)["handlers"]:
            for holding in handler["silent_holdings"]:
                if holding["group_id"] == killed.group_id:
                    return holding  # type: ignore[no-any-return]
        return None

    holding = wait_for(shown, "the group shown as held by a silent worker", timeout=20)
    rescuer = start_work(cli, server_database, "--concurrency", "2", "--lease", "30", env=stale)
    wait_for(lambda: set(handled_ids(output_dir)) == set(ids), "every event handled", timeout=30)
    rescuer.send(signal.SIGTERM)
    rescuer.wait(timeout=15)
    retried = [line for line in started(output_dir) if line.group_id == killed.group_id]
    # Shown once two heartbeats (a second each: a third of the 3 s stale age) were missed.
    assert (str(killed.pid), True, True, 2, True, []) == (
        holding["holder"].split(":")[1],
        holding["heartbeat_age"] >= 2.0,
        holding["rescue_in"] <= 3,
        len(retried),
        float(retried[1].value) < job["lease_expires_at"].timestamp() - 15,
        _tables.jobs(engine),
    )
