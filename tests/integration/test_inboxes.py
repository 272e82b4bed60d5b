"""The inboxes as an operator reads them (``outbox.ops.inboxes``): each declared inbox joined
with what ``outbox_inbox`` keeps, counted up to a cap, and the prune. On SQLite, PostgreSQL
and MariaDB."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import update

from outbox import Outbox, schema
from outbox._db.dialects import db_now_plus
from outbox.inbox import Inbox
from outbox.ops import inboxes

HOUR = 3600.0
CLOCK_TOLERANCE_SECONDS = 60.0


def _within(value: float | None, low: float, high: float) -> bool:
    return value is not None and low <= value <= high


def _receive(app: Outbox, inbox: Inbox, count: int) -> None:
    with app.engine.begin() as conn:
        inbox.receive_many(conn, [f"m-{n}" for n in range(count)])


def _expire(app: Outbox, inbox: str, count: int, seconds_ago: float) -> None:
    """Make ``count`` of ``inbox``'s ids past their expiry by ``seconds_ago``."""
    with app.engine.begin() as conn:
        ids = [f"m-{n}" for n in range(count)]
        conn.execute(
            update(schema.inbox)
            .where(schema.inbox.c.inbox == inbox, schema.inbox.c.message_id.in_(ids))
            .values(expires_at=db_now_plus(-seconds_ago))
        )


def test_each_declared_inbox_and_each_other_one_kept_is_listed_with_its_ids(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A declared inbox with ids, a declared one with none, and ids of an inbox this
    application does not declare: all three, by name, the last with no horizon."""
    app = make_app(database_url)
    orders = app.inbox("orders", horizon=HOUR)
    app.inbox("refunds")
    _receive(app, orders, 5)
    _receive(app, Inbox("legacy", horizon=60), 2)

    found = inboxes.inboxes(app)

    assert [
        ("legacy", False, None, 2, 0),
        ("orders", True, HOUR, 5, 0),
        ("refunds", True, 7 * 86_400.0, 0, 0),
    ] == [(i.name, i.declared, i.horizon, i.ids, i.expired) for i in found]
    _, order, refund = found
    assert (True, True, True) == (
        _within(order.oldest_age, 0, CLOCK_TOLERANCE_SECONDS),
        _within(order.newest_age, 0, CLOCK_TOLERANCE_SECONDS),
        _within(order.next_expiry_in, HOUR - CLOCK_TOLERANCE_SECONDS, HOUR),
    )
    assert (None, None, None, inboxes.COUNT_CAP) == (
        refund.oldest_age,
        refund.newest_age,
        refund.next_expiry_in,
        refund.capped_at,
    )


def test_ids_past_their_expiry_are_counted_until_a_prune_deletes_them(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Two of four ids expired a minute ago: counted as expired, the next expiry a minute
    past; the prune deletes those two and no other."""
    app = make_app(database_url)
    orders = app.inbox("orders", horizon=HOUR)
    _receive(app, orders, 4)
    _expire(app, "orders", 2, 60.0)

    [before] = inboxes.inboxes(app)
    pruned = inboxes.prune(app)
    [after] = inboxes.inboxes(app)

    assert (4, 2, True, 2, 2, 0) == (
        before.ids,
        before.expired,
        _within(before.next_expiry_in, -60.0 - CLOCK_TOLERANCE_SECONDS, 0),
        pruned,
        after.ids,
        after.expired,
    )


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_counts_stop_at_the_cap_they_are_read_with(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Counted up to 3, an inbox of 5 ids (4 expired) says 3 and 3, and the cap it was
    counted to; without a cap, the exact counts."""
    app = make_app(database_url)
    orders = app.inbox("orders")
    _receive(app, orders, 5)
    _expire(app, "orders", 4, 60.0)

    [capped] = inboxes.inboxes(app, count_cap=3)
    [exact] = inboxes.inboxes(app, count_cap=None)

    assert ((3, 3, 3), (5, 4, None)) == (
        (capped.ids, capped.expired, capped.capped_at),
        (exact.ids, exact.expired, exact.capped_at),
    )
