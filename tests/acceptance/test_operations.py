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


def test_replay_dry_run_reports_dead_letters_and_their_groups_and_changes_nothing(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay --status dead --dry-run`` says how many events it would replay, names
    their groups, and leaves them archived."""
    groups = {str(row["group_id"]) for row in _tables.archive(dead_letters)}
    result = cli.run(
        "--app", APP, "--database-url", database_url, "replay", "--status", "dead", "--dry-run"
    )  # fmt: skip

    lines = result.stdout.strip().splitlines()
    named = {line.split()[1] for line in lines[2:]}
    assert (0, "would replay 10 events (record_activity: 10)", groups, DEAD, []) == (
        result.code,
        lines[0],
        named,
        len(_tables.archive(dead_letters)),
        _tables.buffer_rows(dead_letters),
    )


def test_replay_status_dead_puts_dead_letters_back_into_their_buffer_unclaimed(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay --status dead`` (the README's spelling) puts dead-lettered events back
    into the buffer; the archive keeps their rows, marked replayed by the operation it names."""
    result = cli.run("--app", APP, "--database-url", database_url, "replay", "--status", "dead")
    operations = {row["operation_id"] for row in _tables.archive(dead_letters)}

    assert (
        0,
        f"replayed 10 events (record_activity: 10) (operation {min(operations)})",
        {"replayed": DEAD},
        1,
        [(n, None) for n in range(DEAD)],
    ) == (
        result.code,
        result.stdout.strip(),
        _tables.archive_statuses(dead_letters),
        len(operations),
        _activity_ids(dead_letters),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("status", ["DEAD", "Dead", "discarded"])
def test_replay_status_takes_the_statuses_words_in_any_case(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], status: str
) -> None:
    """``--status`` takes the words ``outbox status`` and the docs use, in any case."""
    engine = connect(database_url)
    _tables.add_archived(engine, status.lower(), 2)
    result = cli.run(
        "--app", APP, "--database-url", database_url, "replay", "--status", status, "--dry-run"
    )  # fmt: skip

    assert (0, "would replay 2 events (record_activity: 2)") == (
        result.code,
        result.stdout.splitlines()[0],
    )


def test_replay_without_status_says_what_it_would_include_and_changes_nothing(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay`` with no --status, --all or --group exits 2, asks for one, counts what
    the archive holds per status, and replays nothing: not the dead letters, not the
    discarded events."""
    _tables.add_archived(dead_letters, "discarded", 3)
    result = cli.run("--app", APP, "--database-url", database_url, "replay")

    assert (
        2,
        "Error: replay needs --status (one or several of succeeded, dead, expired, discarded) "
        "or --all; the archive holds 10 dead, 3 discarded",
        {"dead": DEAD, "discarded": 3},
        [],
    ) == (
        result.code,
        result.stderr.strip(),
        _tables.archive_statuses(dead_letters),
        _tables.buffer_rows(dead_letters),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replay_status_dead_leaves_discarded_events_archived(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """Only the statuses named are replayed: discarded events stay in the archive."""
    _tables.add_archived(dead_letters, "discarded", 3)
    result = cli.run("--app", APP, "--database-url", database_url, "replay", "--status", "dead")

    assert (0, {"discarded": 3, "replayed": DEAD}, DEAD) == (
        result.code,
        _tables.archive_statuses(dead_letters),
        len(_activity_ids(dead_letters)),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_replay_of_one_group_needs_no_status(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox replay --group G``: a group named is explicit, its events are replayed."""
    group_id = _tables.archive(dead_letters)[0]["group_id"]
    in_group = sum(row["group_id"] == group_id for row in _tables.archive(dead_letters))
    result = cli.run(
        "--app", APP, "--database-url", database_url, "replay", "--group", str(group_id)
    )  # fmt: skip

    left = {"dead": DEAD - in_group} if in_group < DEAD else {}
    assert (0, in_group, {**left, "replayed": in_group}) == (
        result.code,
        len(_activity_ids(dead_letters)),
        _tables.archive_statuses(dead_letters),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ("--status", "DEADD"),
            "Invalid value for '--status': 'DEADD' is not one of 'succeeded', 'dead', "
            "'expired', 'discarded', 'superseded', 'replayed'.",
        ),
        (("--status", "dead", "--all"), "Error: --status and --all: give one or the other"),
    ],
    ids=["unknown", "both"],
)
def test_replay_with_a_bad_status_exits_2_naming_the_option(
    cli: Cli, database_url: str, options: tuple[str, ...], message: str
) -> None:
    """An unknown --status, or --status with --all: exit 2, one line naming the option (and
    the accepted values)."""
    result = cli.run("--app", APP, "--database-url", database_url, "replay", *options)

    assert (2, True) == (result.code, result.stderr.strip().splitlines()[-1].endswith(message))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_prune_older_than_zero_keeps_dead_letters(
    cli: Cli, database_url: str, dead_letters: Engine
) -> None:
    """``outbox prune --older-than 0s`` deletes the rows that are history and keeps the dead
    letters, saying so (it needs no --app)."""
    _tables.add_archived(dead_letters, "succeeded", 2)
    _tables.add_archived(dead_letters, "discarded", 1)
    _tables.add_archived(dead_letters, "expired", 1)
    result = cli.run("--database-url", database_url, "prune", "--older-than", "0s")

    assert (
        0,
        [
            "pruned 4 archive rows, 0 idle rate limits",
            "kept 10 dead letters as old: replay them (outbox replay --status dead) or prune "
            "them by name (--status dead)",
        ],
        {"dead": DEAD},
    ) == (
        result.code,
        result.stdout.strip().splitlines(),
        _tables.archive_statuses(dead_letters),
    )


def test_prune_dry_run_counts_per_handler_and_status_and_deletes_nothing(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox prune --dry-run`` counts the rows old enough, per handler and status, of the
    default statuses (not dead letters, which it says it keeps), and deletes none."""
    engine = connect(database_url)
    _tables.add_archived(engine, "succeeded", 3, age=7200.0)
    _tables.add_archived(engine, "discarded", 2, age=7200.0, handler="record_email")
    _tables.add_archived(engine, "dead", 4, age=7200.0)
    _tables.add_archived(engine, "succeeded", 5)
    result = cli.run(
        "--database-url", database_url, "prune", "--older-than", "1h", "--dry-run"
    )  # fmt: skip

    rows = [line.split() for line in result.stdout.strip().splitlines()]
    assert (
        0,
        [
            ["handler", "status", "rows"],
            ["record_activity", "succeeded", "3"],
            ["record_email", "discarded", "2"],
            ["would", "prune", "5", "archive", "rows"],
        ],
        True,
        {"succeeded": 8, "discarded": 2, "dead": 4},
    ) == (
        result.code,
        rows[:4],
        result.stdout.strip().endswith(
            "kept 4 dead letters as old: replay them (outbox replay "
            "--status dead) or prune them by name (--status dead)"
        ),
        _tables.archive_statuses(engine),
    )


@pytest.mark.parametrize(
    ("options", "left"),
    [
        (("--status", "dead"), {"succeeded": 3, "discarded": 2}),
        (("--status", "DEAD", "--status", "discarded"), {"succeeded": 3}),
        (("--all",), {}),
    ],
    ids=["dead", "dead-and-discarded", "all"],
)
def test_prune_status_selects_what_is_deleted(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    options: tuple[str, ...],
    left: dict[str, int],
) -> None:
    """``--status`` (repeatable, any case) prunes only the statuses named; ``--all`` every
    status, dead letters too."""
    engine = connect(database_url)
    _tables.add_archived(engine, "succeeded", 3, age=7200.0)
    _tables.add_archived(engine, "discarded", 2, age=7200.0)
    _tables.add_archived(engine, "dead", 4, age=7200.0)
    result = cli.run("--database-url", database_url, "prune", "--older-than", "1h", *options)

    assert (0, left) == (result.code, _tables.archive_statuses(engine))


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
    """A group whose completion the database refuses is held: the burst run that held it exits
    1 saying so, ``status`` counts it, ``check`` exits 1, ``refused list`` shows its error, and
    ``refused release`` (once the cause is fixed) lets a worker finish it."""
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
    assert "1 groups held as refused" in worked.stderr
    assert (
        1,
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
