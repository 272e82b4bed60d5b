"""``outbox groups``, ``show``, ``find``, ``dead``, ``retry``, ``discard``, ``history`` and
``replay`` by the groups' filters or with edit: what an operator runs to see groups and act on
them."""

from __future__ import annotations

import getpass
import json
import re
import socket
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from sqlalchemy import Engine, insert, select

from outbox import schema
from outbox._db.dialects import db_now_plus
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli
from tests.acceptance.cli_app import FAIL_ENV, MAX_ATTEMPTS_ENV, ORDERED_ENV
from tests.models import ActivityEvent

EVENTS = 10
"""Events the ``dead_group`` fixture dead-letters, in one group."""
ERROR = "RuntimeError: the downstream API refused the batch (on purpose)"
"""The first line of the error the test application's failing handler records."""

on_postgresql = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


class DeadGroup(NamedTuple):
    """A group a worker dead-lettered: where it is, its events, and the worker that tried it."""

    engine: Engine
    group_id: str
    event_ids: list[int]
    worker: str


def _dead_letter(
    cli: Cli, url: str, engine: Engine, commit_events: Any, env: dict[str, str] | None = None
) -> tuple[list[int], str]:
    """Commit ten events and let a handler that always fails, with one attempt, dead-letter
    them; their ids and the worker's name."""
    event_ids = commit_events(engine, EVENTS)
    result = cli.run(
        "--app", APP, "--database-url", url, "work", "--burst", "--poll-interval", "0.2",
        env={FAIL_ENV: "1", MAX_ATTEMPTS_ENV: "1", **(env or {})},
    )  # fmt: skip
    worker = re.search(r"worker (\S+) stopped", result.output)
    assert (0, EVENTS, True) == (
        result.code,
        len(_tables.archive(engine)),
        worker is not None,
    ), result.output
    assert worker is not None
    return event_ids, worker.group(1)


@pytest.fixture
def dead_group(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> DeadGroup:
    """Ten events dead-lettered in one group by a handler that always fails."""
    engine = connect(database_url)
    event_ids, worker = _dead_letter(cli, database_url, engine, commit_events)
    (group_id,) = {str(row["group_id"]) for row in _tables.archive(engine)}
    return DeadGroup(engine, group_id, event_ids, worker)


def _run(cli: Cli, url: str, *args: str) -> tuple[int, Any]:
    """Run a command with ``--json``; its exit code and its document (failed: its stderr)."""
    result = cli.run("--app", APP, "--database-url", url, *args, "--json")
    return result.code, json.loads(result.stdout) if result.code == 0 else result.stderr


def _archive_rows(engine: Engine) -> list[tuple[Any, ...]]:
    """(group, event id, status, operation, replay event id) of every archive row, by id."""
    return [
        (
            str(row["group_id"]),
            row["event_id"],
            row["status"],
            row["operation_id"],
            row["replay_event_id"],
        )
        for row in _tables.archive(engine)
    ]


def _buffer(engine: Engine) -> list[tuple[int, int, str]]:
    """(id, activity_id, kind) of every event in the activity buffer, by id."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(ActivityEvent.id, ActivityEvent.activity_id, ActivityEvent.kind).order_by(
                ActivityEvent.id
            )
        )
        return [(int(i), int(a), str(k)) for i, a, k in rows]


def _without_ages(listing: dict[str, Any]) -> dict[str, Any]:
    """A listing without its groups' ages, which grow between two commands."""
    groups = [{k: v for k, v in g.items() if k != "age"} for g in listing["groups"]]
    return {**listing, "groups": groups}


def test_groups_json_lists_dead_groups_with_status_events_and_error(
    cli: Cli, database_url: str, dead_group: DeadGroup
) -> None:
    """``outbox groups --json`` after a failing burst lists the dead group with its status,
    events, attempts and error (with traceback), and counts it."""
    code, listing = _run(cli, database_url, "groups")

    assert (
        0,
        [(dead_group.group_id, "record_activity", "dead", EVENTS, 1, ERROR, True)],
        {"dead": 1},
        1,
        None,
    ) == (
        code,
        [
            (
                g["group_id"],
                g["handler"],
                g["status"],
                g["events"],
                g["attempts"],
                g["error"].splitlines()[0],
                "Traceback (most recent call last)" in g["error"],
            )
            for g in listing["groups"]
        ],
        listing["counts"],
        listing["total"],
        listing["next"],
    )


@on_postgresql
def test_show_json_gives_events_values_attempts_and_archived_counts(
    cli: Cli, database_url: str, dead_group: DeadGroup
) -> None:
    """``outbox show GROUP --json``: each event's values, the attempt that failed with its
    worker and traceback, and the group's events in the archive by status."""
    code, detail = _run(cli, database_url, "show", dead_group.group_id)

    events = [
        (e["id"], e["status"], e["values"]["activity_id"], e["values"]["kind"])
        for e in detail["events"]
    ]
    attempts = [
        (
            a["attempt"],
            a["outcome"],
            a["worker"],
            a["error"].splitlines()[0],
            "\nTraceback (most recent call last):\n" in a["error"],
        )
        for a in detail["attempts"]
    ]
    assert (
        0,
        ("dead", EVENTS),
        [(i, "dead", n, "viewed") for n, i in enumerate(dead_group.event_ids)],
        [(1, "dead", dead_group.worker, ERROR, True)],
        {"dead": EVENTS},
    ) == (
        code,
        (detail["group"]["status"], detail["group"]["events"]),
        events,
        attempts,
        detail["archived"],
    )


@on_postgresql
def test_show_of_an_unknown_group_exits_1_in_one_line(cli: Cli, database_url: str) -> None:
    """``outbox show`` of a group outbox has no trace of exits 1 with one line naming it."""
    group_id = uuid.uuid4()
    result = cli.run("--app", APP, "--database-url", database_url, "show", str(group_id))

    assert (1, [f"Error: no group {group_id}: no job, event or attempt of it is known"]) == (
        result.code,
        result.stderr.strip().splitlines(),
    )


@on_postgresql
def test_show_of_a_group_delivered_without_archive_says_so(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox show`` of a group known only by a failed attempt (its handler deleted its
    events once delivered, without archiving): succeeded, under its handler, not archived."""
    engine = connect(database_url)
    group_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            schema.attempts.insert().values(
                handler="record_activity", group_id=group_id, attempt=1, outcome="failed",
                worker="host-1-abc", error="RuntimeError: once",
            )
        )  # fmt: skip
    result = cli.run("--app", APP, "--database-url", database_url, "show", str(group_id))
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert (
        0,
        True,
        True,
        True,
    ) == (
        result.code,
        "handler   record_activity" in lines,
        "status    succeeded" in lines,
        "archived  no: delivered, and its handler does not archive" in lines,
    ), result.output


@on_postgresql
def test_dead_list_is_groups_of_status_dead_and_held(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """``outbox dead list`` lists what ``outbox groups --status dead --status held`` does: the
    dead groups and those holding their ordering keys."""
    engine = connect(database_url)
    _dead_letter(cli, database_url, engine, commit_events, {ORDERED_ENV: "1"})
    _tables.add_archived(engine, "dead", 2)

    code, dead = _run(cli, database_url, "dead", "list")
    _, listed = _run(cli, database_url, "groups", "--status", "dead", "--status", "held")

    assert (0, ["held", "dead", "dead"], _without_ages(listed)) == (
        code,
        [g["status"] for g in dead["groups"]],
        _without_ages(dead),
    )


@on_postgresql
def test_discard_dry_run_names_the_groups_and_changes_nothing(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox discard --status dead --dry-run`` names each group it would discard, counts
    them, and leaves the archive as it was, with no operation recorded."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2)
    before = _archive_rows(engine)
    result = cli.run(
        "--app", APP, "--database-url", database_url, "discard", "--status", "dead", "--dry-run"
    )  # fmt: skip

    lines = result.stdout.strip().splitlines()
    assert (
        0,
        [(row[0], "dead") for row in before],
        "would discard 2 groups, 2 events",
        before,
        0,
    ) == (
        result.code,
        [(line.split()[1], line.split()[2]) for line in lines[1:-1]],
        lines[-1],
        _archive_rows(engine),
        _tables.count(engine, schema.operations),
    )


@on_postgresql
def test_discard_of_a_group_marks_its_rows_and_history_records_who_and_why(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox discard --group G --reason ...`` marks the group's archive rows discarded by
    an operation, and ``outbox history --json`` shows it: action, ``user@host``, the
    selection, the reason and the counts; the other dead group stays dead."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2, group_id=uuid.uuid4())
    _tables.add_archived(engine, "dead", 1)
    chosen, _, other = (row[0] for row in _archive_rows(engine))
    discarded = cli.run(
        "--app", APP, "--database-url", database_url,
        "discard", "--group", chosen, "--reason", "the partner closed the account",
    )  # fmt: skip
    code, history = _run(cli, database_url, "history")

    operation = history[0]["id"] if history else None
    assert (
        (0, 0),
        [
            (chosen, 1, "discarded", operation, None),
            (chosen, 2, "discarded", operation, None),
            (other, 1, "dead", None, None),
        ],
        [
            (
                "discard",
                f"{getpass.getuser()}@{socket.gethostname()}",
                {"group_ids": [chosen]},
                "the partner closed the account",
                1,
                2,
            )
        ],
    ) == (
        (discarded.code, code),
        _archive_rows(engine),
        [
            (o["action"], o["actor"], o["selection"], o["detail"], o["groups"], o["events"])
            for o in history
        ],
    ), discarded.output


@on_postgresql
def test_discard_without_a_filter_exits_2_and_changes_nothing(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox discard`` given no filter would give up every group: it exits 2 asking for
    one, and the dead groups stay."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2)
    result = cli.run("--app", APP, "--database-url", database_url, "discard")

    assert (
        2,
        [
            "Error: discard needs a filter: --handler, --status, --older-than, --error, --key, "
            "--payload or --group"
        ],
        {"dead": 2},
    ) == (
        result.code,
        result.stderr.strip().splitlines(),
        _tables.archive_statuses(engine),
    )


def test_find_says_where_a_group_and_an_event_are(
    cli: Cli, database_url: str, dead_group: DeadGroup
) -> None:
    """``outbox find GROUP --json`` finds the group dead; ``outbox find EVENT`` finds the
    event in it and says how far the archive was looked through; no text exits 2."""
    code, by_group = _run(cli, database_url, "find", dead_group.group_id)
    event = cli.run(
        "--app", APP, "--database-url", database_url, "find", str(dead_group.event_ids[0])
    )
    empty = cli.run("--app", APP, "--database-url", database_url, "find", " ")
    lines = event.stdout.strip().splitlines()
    assert (
        (0, [("group_id", "dead", dead_group.group_id, "dead")]),
        (0, True, "note: event ids searched among the newest 100,000 archived events"),
        (2, "Error: text: expected an event id, a group id or a key"),
    ) == (
        (code, [(f["taken"], f["place"], f["group_id"], f["status"]) for f in by_group["found"]]),
        (
            event.code,
            any(line.split()[:2] == ["event_id", "dead"] for line in lines[1:]),
            lines[-1],
        ),
        (empty.code, empty.stderr.strip().split(", got")[0]),
    ), event.output + empty.output


def _deferred_job(engine: Engine) -> str:
    """A group of the activity handler deferred by its downstream, due in an hour."""
    group_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            insert(schema.jobs).values(
                kind="batch", handler="record_activity", group_id=group_id, priority=0,
                deferrals=1, run_at=db_now_plus(3600), last_error="RetryAfter: 3600 s",
            )
        )  # fmt: skip
    return str(group_id)


def test_show_and_the_listing_give_a_groups_age_and_next_run_as_a_person_reads_them(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """A group deferred for an hour: ``outbox show`` and ``outbox groups`` say it runs in 59
    minutes and some seconds (they said ``in 60.0m``); ``--json`` keeps the seconds."""
    group_id = _deferred_job(connect(database_url))
    url = ("--app", APP, "--database-url", database_url)
    shown = cli.run(*url, "show", group_id).stdout
    listed = cli.run(*url, "groups", "--status", "deferred").stdout
    code, detail = _run(cli, database_url, "show", group_id)
    soon = r"in 59 min( \d+ s)?"
    assert (True, True, 0, True) == (
        bool(re.search(rf"^  next run  {soon}$", shown, re.MULTILINE)),
        bool(re.search(rf"  {soon}  ", listed)),
        code,
        3500 < detail["group"]["due_in"] <= 3600,
    ), shown + listed


@on_postgresql
def test_retry_dry_run_first_then_makes_a_deferred_group_due_and_records_it(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox retry --status deferred --dry-run`` names the deferred group and changes
    nothing; without ``--dry-run`` it makes the group due now and ``outbox history`` records
    the retry; a dead group the filter does not take stays."""
    engine = connect(database_url)
    deferred = _deferred_job(engine)
    _tables.add_archived(engine, "dead", 1)
    url = ("--app", APP, "--database-url", database_url)
    dry = cli.run(*url, "retry", "--status", "deferred", "--dry-run")
    due_before = _due(engine)
    done = cli.run(*url, "retry", "--status", "deferred")
    code, history = _run(cli, database_url, "history")

    assert (
        (0, 0, 0),
        "would make due now 1 group, 0 events",
        {deferred: False},
        "made due now 1 group, 0 events (operation 1)",
        {deferred: True},
        [("retry", {"statuses": ["deferred"]}, 1)],
        {"dead": 1},
    ) == (
        (dry.code, done.code, code),
        dry.stdout.strip().splitlines()[-1],
        due_before,
        done.stdout.strip().splitlines()[-1],
        _due(engine),
        [(o["action"], o["selection"], o["groups"]) for o in history],
        _tables.archive_statuses(engine),
    ), dry.output + done.output


def _due(engine: Engine) -> dict[str, bool]:
    """Each batch job's group, and whether it is due now."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(schema.jobs.c.group_id, schema.jobs.c.run_at <= db_now_plus(0)).where(
                schema.jobs.c.kind == "batch"
            )
        )
        return {str(g): bool(due) for g, due in rows}


@on_postgresql
def test_retry_without_a_filter_exits_2(cli: Cli, database_url: str) -> None:
    """``outbox retry`` given no filter would take every group: it exits 2 asking for one."""
    result = cli.run("--app", APP, "--database-url", database_url, "retry")
    assert (2, "Error: retry needs a filter") == (result.code, result.stderr.strip()[:27])


@on_postgresql
def test_replay_with_edit_puts_one_event_back_with_the_value_changed(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox replay --group G --event ID --set activity_id=42`` puts that one event back
    into its buffer with the new value (its other values as archived); its archive row is
    marked replayed, pointing at the new event; the group's other events stay dead."""
    engine = connect(database_url)
    group_id = str(uuid.uuid4())
    _tables.add_archived(engine, "dead", 3, group_id=uuid.UUID(group_id))
    code, edited = _run(
        cli, database_url,
        "replay", "--group", group_id, "--event", "2", "--set", "activity_id=42",
    )  # fmt: skip

    new_id = edited["new_event_id"]
    assert (
        0,
        ["activity_id"],
        [(new_id, 42, "viewed")],
        [
            (group_id, 1, "dead", None, None),
            (group_id, 2, "replayed", edited["operation_id"], new_id),
            (group_id, 3, "dead", None, None),
        ],
    ) == (code, edited["changed"], _buffer(engine), _archive_rows(engine))


@on_postgresql
def test_the_readme_s_poison_example_fixes_a_discarded_event(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox replay --group G --event ID --set ...`` of an event the downstream refused for
    good (archived as discarded): exit 0, the event back under its own id with the value
    changed, its row marked replayed and pointing at it."""
    engine = connect(database_url)
    group_id = str(uuid.uuid4())
    _tables.add_archived(engine, "discarded", 2, group_id=uuid.UUID(group_id))
    code, edited = _run(
        cli, database_url, "replay", "--group", group_id, "--event", "2", "--set", "kind=fixed"
    )
    assert (
        0,
        [(2, 1, "fixed")],
        [
            (group_id, 1, "discarded", None, None),
            (group_id, 2, "replayed", edited["operation_id"], 2),
        ],
    ) == (code, _buffer(engine), _archive_rows(engine)), edited


@on_postgresql
def test_replay_leaves_an_event_whose_id_is_taken_and_new_ids_replays_it(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """A dead event whose id a row of its buffer holds: ``outbox replay`` puts the others back
    under their ids and exits 1 naming it; ``--new-ids`` replays it under a new id."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2)
    with engine.begin() as conn:
        conn.execute(ActivityEvent.__table__.insert().values(id=1, activity_id=99))
    first = cli.run("--app", APP, "--database-url", database_url, "replay", "--status", "dead")
    code, renewed = _run(cli, database_url, "replay", "--status", "dead", "--new-ids")
    buffered = [i for i, _, _ in _buffer(engine)]
    assert (1, True, 0, ([1, 2], 3), [(1, "replayed", buffered[2]), (2, "replayed", 2)]) == (
        first.code,
        "event 1: id taken by another row of test_activity_events" in first.stderr,
        code,
        (buffered[:2], len(buffered)),
        [(row[1], row[2], row[4]) for row in _archive_rows(engine)],
    ), (first.stderr, renewed)


@pytest.mark.parametrize(
    ("database_url", "change", "message"),
    [
        (
            "postgresql",
            "colour=red",
            "Error: 'colour' is not a column of buffer test_activity_events; its columns: "
            "activity_id, kind",
        ),
        (
            "postgresql",
            "id=7",
            "Error: 'id' is outbox's own column of buffer test_activity_events; its columns: "
            "activity_id, kind",
        ),
        (
            "postgresql",
            f"kind={'x' * 40}",
            "Error: kind: the database refused the new value (StringDataRightTruncation "
            "[22001]: value too long for type character varying(32))",
        ),
    ],
    indirect=["database_url"],
    ids=["unknown-column", "own-column", "too-long"],
)
def test_replay_with_edit_of_a_column_it_cannot_set_exits_2_and_changes_nothing(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], change: str, message: str
) -> None:
    """A ``--set`` of a column the buffer lacks, of outbox's own column, or of a value the
    column cannot hold: exit 2, one line naming the column; nothing replayed or recorded."""
    engine = connect(database_url)
    group_id = uuid.uuid4()
    _tables.add_archived(engine, "dead", 2, group_id=group_id)
    result = cli.run(
        "--app", APP, "--database-url", database_url,
        "replay", "--group", str(group_id), "--event", "1", "--set", change,
    )  # fmt: skip

    assert (2, [message], {"dead": 2}, [], 0) == (
        result.code,
        result.stderr.strip().splitlines(),
        _tables.archive_statuses(engine),
        _buffer(engine),
        _tables.count(engine, schema.operations),
    )


@on_postgresql
def test_replay_error_replays_only_the_dead_groups_whose_error_holds_the_text(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox replay --error TEXT`` replays the dead groups whose error holds the text (any
    case) and leaves the others dead."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2, error="TimeoutError: the partner API timed out")
    _tables.add_archived(engine, "dead", 3, error="ValueError: no such account")
    result = cli.run(
        "--app", APP, "--database-url", database_url, "replay", "--error", "Timed Out"
    )  # fmt: skip

    rows = _tables.archive(engine)
    statuses = sorted({(row["error"], row["status"]) for row in rows})
    operation = max(row["operation_id"] or 0 for row in rows)
    assert (
        0,
        f"replayed 2 groups, 2 events (operation {operation})",
        [
            ("TimeoutError: the partner API timed out", "replayed"),
            ("ValueError: no such account", "dead"),
        ],
        2,
    ) == (
        result.code,
        result.stdout.strip().splitlines()[-1],
        statuses,
        len(_buffer(engine)),
    ), result.output


@on_postgresql
def test_groups_limit_prints_a_cursor_and_after_gives_the_next_page(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox groups --limit 1`` shows the first group, counts all of them and prints
    ``more: --after CURSOR``; ``--after CURSOR`` shows the next, the last page no cursor."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2)
    first, second = (row[0] for row in _archive_rows(engine))
    base = ("--app", APP, "--database-url", database_url, "groups", "--limit", "1")
    page = cli.run(*base).stdout.strip().splitlines()
    cursor = page[-1].removeprefix("more: --after ")
    after = cli.run(*base, "--after", cursor).stdout.strip().splitlines()

    assert (
        [first],
        "1 shown of 2 groups: 2 dead",
        True,
        [second],
        ["1 shown of 2 groups: 2 dead"],
    ) == (
        [line.split()[1] for line in page[1:-2]],
        page[-2],
        page[-1].startswith("more: --after "),
        [line.split()[1] for line in after[1:-1]],
        after[-1:],
    )


def test_archive_list_json_gives_the_dead_events_newest_first_with_their_values(
    cli: Cli, database_url: str, dead_group: DeadGroup
) -> None:
    """``outbox archive list --status dead --json``: each dead event, newest first, with its
    values and error; ``--limit`` pages with ``next``."""
    code, found = _run(cli, database_url, "archive", "list", "--status", "dead", "--limit", "4")
    assert (0, 4, ["dead"] * 4, True, True) == (
        code,
        len(found["events"]),
        [e["status"] for e in found["events"]],
        [e["id"] for e in found["events"]]
        == sorted((e["id"] for e in found["events"]), reverse=True),
        found["next"] == found["events"][-1]["id"] and ERROR in found["events"][0]["error"],
    )
