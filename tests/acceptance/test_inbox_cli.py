"""``outbox inbox list``, ``outbox inbox prune`` and the inboxes in ``outbox status``: what the
operator runs to see the inboxes without SQL."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, update

from outbox import schema
from outbox._db.dialects import db_now_plus
from outbox.inbox import Inbox
from tests.acceptance import inbox_app
from tests.acceptance._cli import Cli

APP = "tests.acceptance.inbox_app:app"
pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def _receive(engine: Engine, inbox: Inbox, count: int) -> None:
    with engine.begin() as conn:
        inbox.receive_many(conn, [f"{inbox.name}-{n}" for n in range(count)])


def _expire(engine: Engine, *message_ids: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(schema.inbox)
            .where(schema.inbox.c.message_id.in_(message_ids))
            .values(expires_at=db_now_plus(-60))
        )


def test_inbox_list_shows_each_inbox_declared_or_kept(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Three ids of a declared inbox, none of another, two of an inbox the application does
    not declare: the JSON lists the three inboxes with their counts, the table a row each."""
    engine = connect(database_url)
    _receive(engine, inbox_app.orders, 3)
    _receive(engine, Inbox("legacy", horizon=60), 2)
    _expire(engine, "orders-0")

    listed = cli.run("--app", APP, "--database-url", database_url, "inbox", "list", "--json")
    table = cli.run("--app", APP, "--database-url", database_url, "inbox", "list")

    found = [(i["name"], i["declared"], i["horizon"], i["ids"], i["expired"])
             for i in json.loads(listed.stdout)]  # fmt: skip
    rows = [line.split()[:3] for line in table.stdout.splitlines()]
    assert (
        0,
        [("legacy", False, None, 2, 0), ("orders", True, 3600.0, 3, 1),
         ("refunds", True, 604800.0, 0, 0)],
        0,
        [["inbox", "horizon", "ids"], ["legacy", "not", "declared"], ["orders", "1", "h"],
         ["refunds", "7", "d"], ["3", "inboxes"]],
    ) == (listed.code, found, table.code, rows)  # fmt: skip


def test_inbox_prune_deletes_the_ids_past_their_horizon_and_says_how_many(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Two of three ids past their horizon: the prune deletes those two, and the list then
    counts the one left."""
    engine = connect(database_url)
    _receive(engine, inbox_app.orders, 3)
    _expire(engine, "orders-0", "orders-1")

    pruned = cli.run("--database-url", database_url, "inbox", "prune")
    listed = cli.run("--app", APP, "--database-url", database_url, "inbox", "list", "--json")

    kept = {i["name"]: (i["ids"], i["expired"]) for i in json.loads(listed.stdout)}
    assert (0, "pruned 2 inbox ids", {"orders": (1, 0), "refunds": (0, 0)}) == (
        pruned.code,
        pruned.stdout.strip(),
        kept,
    )


def test_status_says_what_each_inbox_keeps(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """``outbox status`` has a line per inbox: its ids, its horizon, the oldest's age and
    the ids past their horizon."""
    engine = connect(database_url)
    _receive(engine, inbox_app.orders, 3)
    _expire(engine, "orders-0")

    text = cli.run("--app", APP, "--database-url", database_url, "status")

    [orders, refunds] = [line for line in text.stdout.splitlines() if line.startswith("inbox ")]
    assert (0, True, True, "inbox refunds: 0 ids (kept 7 d)") == (
        text.code,
        orders.startswith("inbox orders: 3 ids (kept 1 h), the oldest "),
        orders.endswith("; 1 past their horizon, not pruned yet"),
        refunds,
    )
