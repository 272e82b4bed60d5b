"""``outbox run --once`` as cron runs it: real processes, several at once on one tick."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from outbox import schema
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli, handled, handled_ids, started
from tests.acceptance.cli_app import HOLD_ENV
from tests.models import ActivityEvent, EmailEvent

RUNS_AT_ONCE = 3
HOUR = "3600"
"""A schedule long enough that runs started together share its tick."""
LEASE = "3"
"""A killed run's groups wait this long: short, for the test's time."""


def _run_once(database_url: str, *args: str) -> tuple[str, ...]:
    return ("--app", APP, "--database-url", database_url, "run", "--once", *args)


def test_a_run_handles_every_waiting_event_once_and_prints_one_line(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """Exit 0, each event handled once, nothing left, and a one-line summary on stdout."""
    engine = connect(database_url)
    activity = commit_events(engine, 25)
    email = commit_events(engine, 7, EmailEvent)

    result = cli.run(*_run_once(database_url))

    expected = [("record_activity", i) for i in activity] + [("record_email", i) for i in email]
    assert (0, Counter(expected), 0, [], 1) == (
        result.code,
        Counter((line.handler, int(line.value)) for line in handled(output_dir)),
        _tables.count(engine, ActivityEvent.__table__),
        _tables.jobs(engine),
        len(result.stdout.splitlines()),
    )


def test_three_runs_at_once_on_one_tick_distribute_once_and_two_learn_they_lost(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """Three cron runs started together with ``--every``: for each handler one run
    distributes, the two others say in their JSON that they lost the tick; every event is
    handled exactly once, and all exit 0."""
    engine = connect(database_url)
    activity = commit_events(engine, 40)
    email = commit_events(engine, 15, EmailEvent)

    running = [
        cli.start(*_run_once(database_url, "--every", HOUR, "--json")) for _ in range(RUNS_AT_ONCE)
    ]
    results = [r.result() for r in running]

    documents = [json.loads(r.stdout) for r in results]
    won = Counter(name for d in documents for name in d["distribution"]["won"])
    lost = Counter(name for d in documents for name in d["distribution"]["lost"])
    ticks = {d["distribution"]["tick"] for d in documents}
    expected = [("record_activity", i) for i in activity] + [("record_email", i) for i in email]
    assert (
        [0] * RUNS_AT_ONCE,
        {"record_activity": 1, "record_email": 1},
        {"record_activity": 2, "record_email": 2},
        1,
        Counter(expected),
    ) == (
        [r.code for r in results],
        won,
        lost,
        len(ticks),
        Counter((line.handler, int(line.value)) for line in handled(output_dir)),
    )


def test_a_run_that_dead_letters_a_group_exits_1_naming_it(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """A group out of attempts: cron sees exit 1 and one line saying what to look at."""
    commit_events(connect(database_url), 3)

    result = cli.run(
        *_run_once(database_url, "--handler", "record_activity"),
        env={"OUTBOX_TEST_FAIL": "1", "OUTBOX_TEST_MAX_ATTEMPTS": "1"},
    )

    assert (1, ["Error: 1 groups dead-lettered and 0 held as refused in this run"]) == (
        result.code,
        [line.split(" (")[0] for line in result.stderr.splitlines() if line.startswith("Error")],
    )


def test_a_run_whose_groups_fail_and_will_be_retried_exits_0(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """A failed attempt is outbox's to retry, not cron's to report: exit 0, the failure
    counted in the JSON."""
    commit_events(connect(database_url), 3)

    result = cli.run(
        *_run_once(database_url, "--handler", "record_activity", "--json"),
        env={"OUTBOX_TEST_FAIL": "1"},
    )

    assert (0, 1) == (result.code, json.loads(result.stdout)["work"]["groups_failed"])


def test_sigterm_lets_the_batch_in_flight_finish_starts_nothing_more_and_exits_0(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
    tmp_path: Path,
) -> None:
    """SIGTERM mid-batch (a CronJob's deadline, a node drain): the batch in flight is handled
    and written, no other starts, the run says it was stopped, exits 0 and leaves no worker
    row; the events not started wait for the next run."""
    engine = connect(database_url)
    commit_events(engine, 30)
    hold = tmp_path / "hold"
    hold.touch()
    running = cli.start(
        *_run_once(database_url, "--handler", "record_activity", "--json"),
        env={HOLD_ENV: str(hold)},
    )
    wait_for(lambda: started(output_dir), "a batch to start")
    running.send(signal.SIGTERM)
    hold.unlink()
    result = running.result()

    document = json.loads(result.stdout)
    assert (0, "stopped", 1, 10, 20, 0) == (
        result.code,
        document["work"]["stopped"],
        document["work"]["groups_succeeded"],
        len(handled(output_dir)),
        _tables.count(engine, ActivityEvent.__table__),
        _tables.count(engine, schema.workers),
    )


def test_a_killed_runs_group_is_handled_by_a_later_run_once_its_lease_ends(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
    tmp_path: Path,
) -> None:
    """SIGKILL mid-batch (an OOM kill, a lost node): the group stays leased until its lease
    ends; the next run after that rescues it and handles it, each event exactly once."""
    engine = connect(database_url)
    ids = commit_events(engine, 10)
    hold = tmp_path / "hold"
    hold.touch()
    killed = cli.start(
        *_run_once(database_url, "--handler", "record_activity", "--lease", LEASE),
        env={HOLD_ENV: str(hold)},
    )
    (line,) = wait_for(lambda: started(output_dir), "a batch to start")
    killed.send(signal.SIGKILL)
    killed.wait(timeout=30)
    hold.unlink()
    wait_for(lambda: _tables.lease_expired(engine, uuid.UUID(line.group_id)), "the lease to end")

    result = cli.run(*_run_once(database_url, "--handler", "record_activity", "--json"))

    document = json.loads(result.stdout)
    assert (0, True, 1, ids) == (
        result.code,
        document["rescue"]["rescued"] >= 1,  # the group's job, and the claim job if it ran out
        document["work"]["groups_succeeded"],
        handled_ids(output_dir),
    )
