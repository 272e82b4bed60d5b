"""``outbox migrate`` as an operator runs it: up and down with --to, a downgrade's losses named,
a newer schema refused, two runs at once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, insert, select, text

from outbox import schema
from outbox.inbox import Inbox
from outbox.ops.migrate import current_revision, head_revision, migrate
from tests.acceptance._cli import Cli


def _url(args: str) -> tuple[str, ...]:
    return ("--database-url", args)


PAUSED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _hold_state(engine: Engine) -> None:
    """Two paused handlers (one of them with a counting breaker) and three held keys."""
    with engine.begin() as conn:
        conn.execute(
            insert(schema.handlers),
            [
                {"name": "a", "paused_at": None, "failures": 2, "trips": 0},
                {"name": "b", "paused_at": PAUSED_AT, "failures": 0, "trips": 0},
                {"name": "c", "paused_at": PAUSED_AT, "failures": 0, "trips": 0},
            ],
        )
        conn.execute(
            insert(schema.held_keys),
            [{"handler": "a", "key": str(n), "group_id": uuid.uuid4()} for n in range(3)],
        )


def test_downgrade_that_drops_rows_refuses_naming_them(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0002 over pauses and held keys: exit 1, one line naming each loss, nothing undone."""
    engine = engine_on(empty_url)
    migrate(engine)
    _hold_state(engine)

    result = cli.run(*_url(empty_url), "migrate", "--to", "0002")

    head = head_revision()
    expected = (
        f"Error: {head} -> 0002 drops outbox_handlers: 2 pauses, 1 open or counting breakers; "
        "outbox_held_keys: 3 held ordering keys; pass --yes to downgrade all the same\n"
    )
    assert (1, expected, head) == (result.code, result.stderr, current_revision(engine))


def test_downgrade_below_the_operators_records_refuses_naming_them(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0005 over recorded attempts, operations and replayed rows: exit 1 naming each."""
    engine = engine_on(empty_url)
    migrate(engine)
    group_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            insert(schema.attempts).values(
                handler="a", group_id=group_id, attempt=1, outcome="failed"
            )
        )
        conn.execute(insert(schema.operations).values(action="replay", actor="ops@host"))
        conn.execute(
            insert(schema.archive).values(
                handler="a", buffer="b", event_id=1, group_id=group_id, status="replayed",
                attempts=1, payload={},
            )
        )  # fmt: skip

    result = cli.run(*_url(empty_url), "migrate", "--to", "0005")

    head = head_revision()
    expected = (
        f"Error: {head} -> 0005 drops outbox_attempts: 1 recorded attempts; outbox_operations: 1 "
        "recorded operations; outbox_archive: 1 replayed events' records; pass --yes to "
        "downgrade all the same\n"
    )
    assert (1, expected, head) == (result.code, result.stderr, current_revision(engine))


def test_downgrade_below_the_inbox_refuses_naming_its_ids(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0010 over an inbox's ids: a message delivered again after it would have its
    effect again, so the downgrade names them and waits for --yes."""
    engine = engine_on(empty_url)
    migrate(engine)
    with engine.begin() as conn:
        Inbox("orders").receive_many(conn, ["m-1", "m-2"])

    result = cli.run(*_url(empty_url), "migrate", "--to", "0010")

    expected = (
        f"Error: {head_revision()} -> 0010 drops outbox_inbox: 2 inbox message ids; pass --yes "
        "to downgrade all the same\n"
    )
    assert (1, expected) == (result.code, result.stderr)
    assert 0 == cli.run(*_url(empty_url), "migrate", "--to", "0010", "--yes").code
    assert "0010" == current_revision(engine)


def test_downgrade_below_the_exact_ingest_keys_names_those_it_keeps_one_of(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0010 over ingest keys "k", "K" and "k ": MariaDB's collation before 0011 takes
    them for one, so the downgrade names the two it cannot keep, and with --yes keeps "k"; on
    the other databases keys were always exact, and nothing is lost."""
    engine = engine_on(empty_url)
    migrate(engine)
    with engine.begin() as conn:
        conn.execute(
            schema.ingest_keys.insert(),
            [{"handler": "h", "key": key, "event_id": n} for n, key in enumerate(["k", "K", "k "])],
        )
    folded = engine.dialect.name in ("mysql", "mariadb")

    result = cli.run(*_url(empty_url), "migrate", "--to", "0010")

    if folded:
        expected = (
            f"Error: {head_revision()} -> 0010 drops outbox_ingest_keys: 2 ingest keys one only "
            "apart from another by case, accent or trailing space; pass --yes to downgrade all "
            "the same\n"
        )
        assert (1, expected) == (result.code, result.stderr)
        assert 0 == cli.run(*_url(empty_url), "migrate", "--to", "0010", "--yes").code
    else:
        assert 0 == result.code
    assert "0010" == current_revision(engine)
    with engine.connect() as conn:
        keys = sorted(conn.execute(select(schema.ingest_keys.c.key)).scalars())
    assert (["K"] if folded else ["K", "k", "k "]) == keys


def test_downgrade_with_yes_drops_the_rows(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0002 --yes over pauses and held keys: exit 0, the tables at 0002."""
    engine = engine_on(empty_url)
    migrate(engine)
    _hold_state(engine)

    result = cli.run(*_url(empty_url), "migrate", "--to", "0002", "--yes")

    assert (0, "0002") == (result.code, current_revision(engine))
    assert result.stdout.startswith(f"outbox tables migrated from {head_revision()} to 0002 in ")


def test_downgrade_of_empty_tables_needs_no_yes(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to 0001 when nothing would be dropped: exit 0 without --yes, and back up to head."""
    engine = engine_on(empty_url)
    migrate(engine)

    down = cli.run(*_url(empty_url), "migrate", "--to", "0001")
    at = current_revision(engine)
    up = cli.run(*_url(empty_url), "migrate")

    assert (0, "0001", 0, head_revision()) == (down.code, at, up.code, current_revision(engine))


def test_base_with_jobs_refuses_naming_them(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """--to base over workers: exit 1 naming them, the tables still there."""
    engine = engine_on(empty_url)
    migrate(engine)
    with engine.begin() as conn:
        conn.execute(insert(schema.workers).values(id="w1", hostname="h", pid=1, concurrency=1))

    result = cli.run(*_url(empty_url), "migrate", "--to", "base")

    head = head_revision()
    expected = (
        f"Error: {head} -> base drops outbox_workers: 1 workers; "
        "pass --yes to downgrade all the same\n"
    )
    assert (1, expected, head) == (result.code, result.stderr, current_revision(engine))


def test_unknown_revision_is_a_usage_error(
    cli: Cli, make_empty_database: Callable[[str], str]
) -> None:
    """--to a revision outbox does not ship: exit 2, one line naming those it knows."""
    result = cli.run(*_url(make_empty_database("sqlite")), "migrate", "--to", "0099")

    expected = (
        "Error: unknown revision '0099': this outbox knows 0001, 0002, 0003, 0004, 0005, 0006, "
        "0007, 0008, 0009, 0010, 0011, head and base\n"
    )
    assert (2, expected) == (result.code, result.stderr)


def _stamp(engine: Engine, revision: str) -> None:
    """Write a revision into outbox's version table, as a newer outbox's migration would."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE outbox_alembic_version SET version_num = :r"), {"r": revision})


NEWER = (
    "Error: this database's outbox tables are at revision 0099, newer than this outbox knows "
    "(newest {newest}): upgrade outbox, or downgrade the tables with the newer outbox's "
    "`outbox migrate --to {newest}`\n"
)


def test_migrate_on_a_newer_schema_exits_1_naming_both_revisions(
    cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """A database at a revision outbox does not ship: migrate exits 1 in one line."""
    engine = engine_on(empty_url)
    migrate(engine)
    _stamp(engine, "0099")

    result = cli.run(*_url(empty_url), "migrate")

    assert (1, NEWER.format(newest=head_revision())) == (result.code, result.stderr)


def test_commands_on_a_newer_schema_exit_1_naming_both_revisions(
    cli: Cli, make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """A command that checks the schema (prune) refuses a newer schema in the same line."""
    url = make_empty_database("sqlite")
    engine = engine_on(url)
    migrate(engine)
    _stamp(engine, "0099")

    result = cli.run(*_url(url), "prune", "--older-than", "1d", "--dry-run")

    assert (1, NEWER.format(newest=head_revision())) == (result.code, result.stderr)


@pytest.mark.parametrize("round_", range(3))
def test_two_migrates_at_once_both_exit_0(
    round_: int, cli: Cli, empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """Two `outbox migrate` started together on an empty database: both exit 0, no traceback,
    one of them migrated and the other found the tables up to date."""
    first = cli.start(*_url(empty_url), "migrate")
    second = cli.start(*_url(empty_url), "migrate")
    results = [first.result(), second.result()]

    said = sorted(r.stdout.split(" in ")[0] for r in results)
    expected = [
        f"outbox tables are up to date (revision {head_revision()})",
        f"outbox tables migrated from nothing to {head_revision()}",
    ]
    assert ([0, 0], ["", ""]) == ([r.code for r in results], [r.stderr for r in results])
    assert (expected, head_revision()) == (said, current_revision(engine_on(empty_url)))
