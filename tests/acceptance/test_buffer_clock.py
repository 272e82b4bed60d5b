"""``outbox migrate-buffers``, ``outbox work`` and ``outbox check`` on a MariaDB buffer made by
the release that wrote the clock as the session's local time, with the application's sessions
in another zone than UTC (set by the database URL's ``init_command``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from tests.acceptance._cli import APP, LEASE, Cli
from tests.conftest import reset_schema
from tests.models import ActivityEvent

BUFFER = ActivityEvent.__table__.name


def _zoned_url(url: str, zone: str) -> str:
    """``url`` with every session set to ``zone``, as an application's URL may set it."""
    zoned = make_url(url).update_query_dict({"init_command": f"SET time_zone = '{zone}'"})
    return zoned.render_as_string(hide_password=False)


@pytest.fixture(params=["-05:00", "+02:00"])
def zoned_url(request: pytest.FixtureRequest, mariadb_url: str) -> str:
    """The MariaDB database, migrated, its activity buffer as the older release made it;
    sessions at -05:00, then +02:00."""
    return _older_buffer(mariadb_url, request.param)


def _older_buffer(mariadb_url: str, zone: str) -> str:
    reset_schema(mariadb_url)
    url = _zoned_url(mariadb_url, zone)
    with _engine(url) as engine, engine.begin() as conn:
        conn.execute(
            text(
                f"ALTER TABLE {BUFFER} MODIFY created_at DATETIME NOT NULL"
                " DEFAULT CURRENT_TIMESTAMP(6)"
            )
        )
    return url


@contextmanager
def _engine(url: str) -> Iterator[Engine]:
    """An engine on ``url``, disposed when the block ends."""
    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def _write(url: str, minutes_ago: int | None = None) -> None:
    """An event written with the buffer's default (``minutes_ago``: as that long ago, by the
    session's local clock, as the default would have dated it then)."""
    created = "" if minutes_ago is None else ", created_at"
    value = "" if minutes_ago is None else f", NOW() - INTERVAL {minutes_ago} MINUTE"
    with _engine(url) as engine, engine.begin() as conn:
        conn.execute(
            text(f"INSERT INTO {BUFFER} (activity_id, kind{created}) VALUES (1, 'viewed'{value})")
        )


def test_events_are_dated_right_after_migrate_buffers(cli: Cli, zoned_url: str) -> None:
    """An event written 90 minutes ago in local time is 90 minutes old after the command,
    not hours off (at -05:00 it looked 6.5 hours old, at +02:00 not late at all)."""
    _write(zoned_url, minutes_ago=90)
    migrated = cli.run("--app", APP, "--database-url", zoned_url, "migrate-buffers")
    status = cli.run("--app", APP, "--database-url", zoned_url, "status", "--json")
    (row,) = [r for r in json.loads(status.stdout)["handlers"] if r["handler"] == "record_activity"]
    assert (0, 90) == (migrated.code, round(row["oldest_age"] / 60))


def test_a_dry_run_says_what_it_would_do_per_buffer(cli: Cli, mariadb_url: str) -> None:
    """--dry-run names each buffer, the default it would set and the rows it would convert."""
    url = _older_buffer(mariadb_url, "-05:00")
    _write(url)
    _write(url)
    result = cli.run("--app", APP, "--database-url", url, "migrate-buffers", "--dry-run")
    expected = [
        f"{BUFFER}: would set created_at's default to UTC_TIMESTAMP(6); would convert 2 rows "
        "from -05:00 to UTC (created_at keeps whole seconds: DATETIME(6) would rewrite the "
        "table, for your own migration to do when writes can wait)",
        "test_email_events: nothing to do (created_at defaults to utc_timestamp(6))",
    ]
    assert (0, expected) == (result.code, result.stdout.splitlines())


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_elsewhere_there_is_nothing_to_do(
    cli: Cli, kind: str, request: pytest.FixtureRequest, sqlite_url: str
) -> None:
    """PostgreSQL and SQLite: one line saying why nothing needs converting."""
    url = sqlite_url if kind == "sqlite" else request.getfixturevalue("postgres_database")
    reset_schema(url)
    result = cli.run("--app", APP, "--database-url", url, "migrate-buffers")
    reason = {
        "postgresql": "PostgreSQL stores points in time with their zone (timestamptz)",
        "sqlite": "SQLite's clock is UTC in every connection",
    }[kind]
    assert (0, True) == (result.code, result.stdout.startswith(f"nothing to do: {reason}"))


def test_work_refuses_a_buffer_on_the_local_clock(cli: Cli, mariadb_url: str) -> None:
    """`outbox work` in a session at -05:00: exit 1, one line naming the buffer, the zone and
    `outbox migrate-buffers`."""
    url = _older_buffer(mariadb_url, "-05:00")
    result = cli.run("--app", APP, "--database-url", url, "work", "--burst", *LEASE)
    lines = result.stderr.strip().splitlines()
    assert (1, 1, True, True) == (
        result.code,
        len(lines),
        lines[-1].startswith(f"Error: buffer {BUFFER}: created_at defaults to the session's"),
        "time zone is -05:00 (UTC-05:00)" in lines[-1] and "outbox migrate-buffers" in lines[-1],
    )


def test_check_alerts_on_a_buffer_on_the_local_clock(cli: Cli, mariadb_url: str) -> None:
    """`outbox check` in a session at +02:00: an alert line for the buffer, exit 1."""
    url = _older_buffer(mariadb_url, "+02:00")
    result = cli.run("--app", APP, "--database-url", url, "check")
    assert (1, [True]) == (
        result.code,
        [line.startswith(f"alert: buffer {BUFFER}: ") for line in result.stdout.splitlines()],
    )


def test_check_warns_in_a_utc_session(cli: Cli, mariadb_url: str) -> None:
    """`outbox check` in a UTC session: a warning line for the buffer, and exit 0."""
    url = _older_buffer(mariadb_url, "+00:00")
    result = cli.run("--app", APP, "--database-url", url, "check")
    lines = result.stdout.splitlines()
    assert (0, True, "all promises hold") == (
        result.code,
        lines[0].startswith(f"warning: buffer {BUFFER}: "),
        lines[-1],
    )
