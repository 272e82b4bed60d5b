"""``outbox check``: exit 0 while every promise holds, 1 naming the handler that broke one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, update

from outbox._db.dialects import db_now_plus
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
