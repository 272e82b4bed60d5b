"""``outbox status``, ``outbox replay`` and ``outbox prune``: what an operator runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, select

from tests._support import REFUSAL, allow_deletes, refuse_deletes
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli
from tests.acceptance.cli_app import FAIL_ENV, MAX_ATTEMPTS_ENV
from tests.models import ActivityEvent, EmailEvent

DEAD = 10
"""Events the ``dead_letters`` fixture dead-letters."""


@pytest.fixture
def dead_letters(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> Engine:
    """Ten events dead-lettered by a handler that always fails and gets one attempt."""
    engine = connect(database_url)
    commit_events(engine, DEAD)
    result = cli.run(
        "--app", APP,
        "--database-url", database_url,
        "work", "--burst", "--poll-interval", "0.2",
        env={FAIL_ENV: "1", MAX_ATTEMPTS_ENV: "1"},
    )  # fmt: skip
    assert (0, DEAD) == (result.code, len(_tables.archive(engine)))
    return engine


def _activity_ids(engine: Engine) -> list[tuple[int, Any]]:
    """(activity_id, group_id) of the rows in the activity buffer."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(ActivityEvent.activity_id, ActivityEvent.group_id).order_by(
                ActivityEvent.activity_id
            )
        )
        return [(int(activity_id), group_id) for activity_id, group_id in rows]


def test_status_json_reports_the_unclaimed_events_of_each_handler(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """``outbox status --json`` counts the unclaimed events written to each buffer."""
    engine = connect(database_url)
    commit_events(engine, 7)
    commit_events(engine, 3, EmailEvent)

    result = cli.run("--app", APP, "--database-url", database_url, "status", "--json")

    unclaimed = {h["handler"]: h["unclaimed"] for h in json.loads(result.stdout)["handlers"]}
    assert (0, {"record_activity": 7, "record_email": 3}) == (result.code, unclaimed)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replay_dry_run_reports_dead_letters_and_changes_nothing(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay --dry-run`` says how many events it would replay and leaves them archived."""
    result = cli.run("--app", APP, "--database-url", database_url, "replay", "--dry-run")

    assert (0, "would replay 10 events (record_activity: 10)", DEAD, []) == (
        result.code,
        result.stdout.strip(),
        len(_tables.archive(dead_letters)),
        _tables.buffer_rows(dead_letters),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replay_puts_dead_letters_back_into_their_buffer_unclaimed(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay`` moves dead-lettered events out of the archive, back into the buffer."""
    result = cli.run("--app", APP, "--database-url", database_url, "replay")

    assert (
        0,
        "replayed 10 events (record_activity: 10)",
        [],
        [(n, None) for n in range(DEAD)],
    ) == (
        result.code,
        result.stdout.strip(),
        _tables.archive(dead_letters),
        _activity_ids(dead_letters),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_prune_older_than_zero_deletes_every_archive_row(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox prune --older-than 0s`` deletes the archive rows (it needs no --app)."""
    result = cli.run("--database-url", database_url, "prune", "--older-than", "0s")

    assert (0, "pruned 10 archive rows, 0 idle rate limits", []) == (
        result.code,
        result.stdout.strip(),
        _tables.archive(dead_letters),
    )


def test_reindex_lists_each_buffer_index_with_what_it_did(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """On PostgreSQL, ``outbox reindex --dry-run`` lists every index of every buffer (small
    ones are kept); elsewhere it says it needs PostgreSQL, as a usage error."""
    commit_events(connect(database_url), 5)

    result = cli.run("--app", APP, "--database-url", database_url, "reindex", "--dry-run")

    if not database_url.startswith("postgresql"):
        assert (2, True) == (result.code, "runs on PostgreSQL" in result.stderr)
        return
    listed = {
        tuple(line.split()[:2]) for line in result.stdout.splitlines() if "kept" in line.split()
    }
    assert (0, True, True) == (
        result.code,
        ("test_activity_events", "ix_test_activity_events_unclaimed") in listed,
        ("test_email_events", "ix_test_email_events_group_id") in listed,
    )


def test_refused_list_and_release_show_and_free_a_held_group(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """A group whose completion the database refuses is held: ``status`` counts it, ``check``
    exits 1, ``refused list`` shows its error, and ``refused release`` (once the cause is
    fixed) lets a worker finish it."""
    engine = connect(database_url)
    table = ActivityEvent.__table__.name
    refuse_deletes(engine, table)
    commit_events(engine, 3)
    base = ("--app", APP, "--database-url", database_url)
    worked = cli.run(*base, "work", "--burst", "--handler", "record_activity")
    status = json.loads(cli.run(*base, "status", "--json").stdout)["handlers"]
    check = cli.run(*base, "check")
    listed = cli.run(*base, "refused", "list")
    allow_deletes(engine, table)
    released = cli.run(*base, "refused", "release", "--handler", "record_activity")
    again = cli.run(*base, "work", "--burst", "--handler", "record_activity")

    refused_counts = {h["handler"]: h["groups_refused"] for h in status}
    assert (
        0,
        {"record_activity": 1, "record_email": 0},
        1,
        True,
        "released 1 refused group",
        0,
        [],
    ) == (
        worked.code,
        refused_counts,
        check.code,
        REFUSAL in listed.stdout,
        released.stdout.strip(),
        again.code,
        _tables.buffer_rows(engine),
    ), worked.output
