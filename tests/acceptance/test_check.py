"""``outbox check``: exit 0 while every promise holds, 1 naming the handler that broke one."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, update

from outbox._db.dialects import db_now_plus
from tests.acceptance import _tables
from tests.acceptance._cli import APP, Cli
from tests.models import ActivityEvent


def test_check_passes_while_promises_hold(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """Fresh events: exit 0 and "all promises hold"."""
    commit_events(connect(database_url), 3)
    result = cli.run("--app", APP, "--database-url", database_url, "check")
    assert (0, "all promises hold") == (result.code, result.stdout.strip())


def test_check_fails_naming_the_late_handler(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """An event older than the HOUR promise: exit 1, and the line names handler and band."""
    engine = connect(database_url)
    commit_events(engine, 3)
    with engine.begin() as conn:
        conn.execute(update(ActivityEvent).values(created_at=db_now_plus(-7200)))
    result = cli.run("--app", APP, "--database-url", database_url, "check")
    assert (1, True) == (result.code, result.stdout.startswith("record_activity (HOUR): "))


DEAD_ERROR = (
    "RuntimeError: the downstream API refused the batch\nTraceback (most recent call last):"
)


def test_check_fails_on_a_recent_dead_letter(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Events dead-lettered within the window (a day by default): exit 1, naming the handler,
    how many, and the newest one's error, first line only."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2, age=600.0, error="Timeout: an older one")
    _tables.add_archived(engine, "dead", 1, age=60.0, error=DEAD_ERROR)
    result = cli.run("--app", APP, "--database-url", database_url, "check")

    line = result.stdout.strip()
    alert = (
        r"record_activity \(HOUR\): 3 events dead-lettered in the last 1 d, the newest 1 min"
        r"( \d+ s)? ago: RuntimeError: the downstream API refused the batch "
        r"\(outbox replay --status dead\)"
    )
    assert (1, True) == (result.code, bool(re.fullmatch(alert, line))), line


def test_check_passes_once_the_dead_letters_are_older_than_the_window(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Dead letters older than ``--dead-since`` (or of other statuses) raise no alert."""
    engine = connect(database_url)
    _tables.add_archived(engine, "dead", 2, age=7200.0, error=DEAD_ERROR)
    _tables.add_archived(engine, "discarded", 2, age=60.0)
    base = ("--app", APP, "--database-url", database_url)
    within_default = cli.run(*base, "check")
    past_window = cli.run(*base, "check", "--dead-since", "1h")

    assert (1, 0, "all promises hold") == (
        within_default.code,
        past_window.code,
        past_window.stdout.strip(),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("value", ["0", "off", "OFF"])
def test_check_dead_since_off_raises_no_dead_letter_alert(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], value: str
) -> None:
    """``--dead-since 0`` or ``off``: dead letters, however recent, raise no alert."""
    _tables.add_archived(connect(database_url), "dead", 1, error=DEAD_ERROR)
    result = cli.run("--app", APP, "--database-url", database_url, "check", "--dead-since", value)
    assert (0, "all promises hold") == (result.code, result.stdout.strip())


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_check_with_a_bad_dead_since_exits_2_naming_the_option(cli: Cli, database_url: str) -> None:
    """``--dead-since soon``: exit 2, naming the option and what it takes."""
    result = cli.run("--app", APP, "--database-url", database_url, "check", "--dead-since", "soon")
    assert (2, True) == (
        result.code,
        "'--dead-since': 'soon' is not a duration like 90s, 15m, 12h, 30d or 2w, or off"
        in result.stderr,
    )


def test_status_shows_the_dead_letter_alert(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox status`` lists the same alert, and ``--json`` has it with the count."""
    _tables.add_archived(connect(database_url), "dead", 2, error=DEAD_ERROR)
    base = ("--app", APP, "--database-url", database_url, "status")
    table = cli.run(*base)
    document = json.loads(cli.run(*base, "--json").stdout)
    (handler,) = [h for h in document["handlers"] if h["handler"] == "record_activity"]

    alert = "2 events dead-lettered in the last 1 d"
    assert (0, True, 2, True) == (
        table.code,
        f"alert: record_activity (HOUR): {alert}" in table.stdout,
        handler["recent_dead"],
        handler["alerts"][0].startswith(alert),
    )


def test_status_shows_desired_workers(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox status`` says how many worker slots keep every promise, and ``--json`` has
    them, per band, under ``scaling``; with nothing waiting and nothing running, none."""
    base = ("--app", APP, "--database-url", database_url, "status")
    table = cli.run(*base)
    document = json.loads(cli.run(*base, "--json").stdout)
    assert (0, True, 0, 0) == (
        table.code,
        "desired workers: 0 slots (live: 0)" in table.stdout,
        document["scaling"]["desired_workers"],
        sum(b["desired_workers"] for b in document["scaling"]["bands"]),
    )
