"""``outbox pause`` and ``outbox resume``: a paused handler's events wait, and ``status`` and
``check`` say why; resumed, they are handled. Real commands, on every database."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, update

from outbox._db.dialects import db_now_plus
from tests.acceptance._cli import APP, Cli, handled_ids
from tests.acceptance.cli_app import FAIL_ENV, MAX_ATTEMPTS_ENV, ORDERED_ENV
from tests.models import ActivityEvent


def _outbox(cli: Cli, url: str, *args: str) -> Any:
    return cli.run("--app", APP, "--database-url", url, *args)


def test_a_paused_handler_is_not_run_until_resumed(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    engine = connect(database_url)
    ids = commit_events(engine, 5)
    paused = _outbox(cli, database_url, "pause", "record_activity", "--reason", "API migration")
    burst = _outbox(cli, database_url, "work", "--burst")
    status = json.loads(_outbox(cli, database_url, "status", "--json").stdout)
    row = next(r for r in status["handlers"] if r["handler"] == "record_activity")
    assert (0, "paused record_activity until resumed (outbox resume record_activity)") == (
        paused.code,
        paused.stdout.strip(),
    )
    assert (0, [], 5) == (burst.code, handled_ids(output_dir), row["unclaimed"])
    assert (True, "operator", "API migration", None) == (
        row["paused"],
        row["pause_cause"],
        row["pause_reason"],
        row["paused_for"],
    )
    resumed = _outbox(cli, database_url, "resume", "record_activity")
    again = _outbox(cli, database_url, "resume", "record_activity")
    _outbox(cli, database_url, "work", "--burst")
    assert ("resumed record_activity", "record_activity was not paused", ids) == (
        resumed.stdout.strip(),
        again.stdout.strip(),
        handled_ids(output_dir),
    )


def test_status_and_check_say_why_a_paused_handler_is_late(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    engine = connect(database_url)
    commit_events(engine, 2)
    with engine.begin() as conn:
        conn.execute(update(ActivityEvent).values(created_at=db_now_plus(-7200)))
    paused = _outbox(
        cli, database_url, "pause", "record_activity", "--for", "1h", "--reason", "quota"
    )
    status = _outbox(cli, database_url, "status")
    check = _outbox(cli, database_url, "check")
    why = r"paused by an operator for 5\d min( \d\d? s)? more: quota"
    assert re.fullmatch(r"paused record_activity for 59 min( \d\d? s)?\n", paused.stdout)
    assert re.search(rf"^record_activity: {why}$", status.stdout, re.MULTILINE)
    assert (1, True) == (check.code, bool(re.search(rf"\({why}\)$", check.stdout, re.MULTILINE)))


def test_pause_refuses_an_unknown_handler_and_a_bad_time(cli: Cli, database_url: str) -> None:
    unknown = _outbox(cli, database_url, "pause", "nope")
    both = _outbox(
        cli, database_url, "pause", "record_activity", "--for", "1m", "--until", "2030-01-01"
    )
    bad = _outbox(cli, database_url, "pause", "record_activity", "--until", "tomorrow")
    far = _outbox(cli, database_url, "pause", "record_activity", "--until", "9999-12-31")
    long = _outbox(cli, database_url, "pause", "record_activity", "--for", "400d")
    assert (2, True) == (unknown.code, "unknown handler 'nope'" in unknown.stderr)
    assert (2, True) == (both.code, "give --for or --until, not both" in both.stderr)
    assert (2, True) == (bad.code, "is not an ISO 8601 time" in bad.stderr)
    assert (2, True) == (far.code, "more than outbox waits for anything" in far.stderr)
    assert (2, True) == (long.code, "'400d' is longer than 366 days" in long.stderr)
    status = json.loads(_outbox(cli, database_url, "status", "--json").stdout)
    assert not any(handler["paused"] for handler in status["handlers"])


def test_held_keys_are_listed_shown_by_status_and_released(
    cli: Cli,
    database_url: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """An ordered handler's dead group holds its key: ``held list`` and ``status`` name it,
    ``check`` alerts, and once released the key's later events are handled."""
    engine = connect(database_url)
    commit_events(engine, 1, activity_id=7)
    ordered = {ORDERED_ENV: "1", MAX_ATTEMPTS_ENV: "1"}
    dying = _outbox_env(cli, database_url, {**ordered, FAIL_ENV: "1"}, "work", "--burst")
    later = commit_events(engine, 2, activity_id=7)
    _outbox_env(cli, database_url, ordered, "work", "--burst")
    listed = _outbox_env(cli, database_url, ordered, "held", "list")
    status = _outbox_env(cli, database_url, ordered, "status")
    check = _outbox_env(cli, database_url, ordered, "check")
    assert (0, [], "1 held key") == (
        dying.code,
        handled_ids(output_dir),
        listed.stdout.splitlines()[-1],
    )
    assert "record_activity: key 7 held by a dead group (outbox held list)" in status.stdout
    assert (1, True) == (check.code, "1 ordering key held by dead groups" in check.stdout)
    released = _outbox_env(cli, database_url, ordered, "held", "release", "--key", "7")
    _outbox_env(cli, database_url, ordered, "work", "--burst")
    assert ("released 1 held key", later) == (released.stdout.strip(), handled_ids(output_dir))


def _outbox_env(cli: Cli, url: str, env: dict[str, str], *args: str) -> Any:
    return cli.run("--app", APP, "--database-url", url, *args, env=env)
