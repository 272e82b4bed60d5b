"""The inboxes as an operator sees them (:mod:`outbox.inbox`): each inbox the application
declares, with what ``outbox_inbox`` keeps of it, and the prune of the ids past their horizon.

``outbox inbox list``, ``outbox status``, the console's Inboxes page, ``GET /api/v1/inboxes``
and the Prometheus gauges ask :func:`inboxes`, so that they agree.

*What a reading costs.* An inbox keeps an id a row for its horizon: a million messages a day
under the seven-day default is 7 million rows, too many to count on every scrape or page load.
So the counts stop at a cap (:data:`COUNT_CAP`, as the console's status counts do: a count that
reached it means at least that many), the inboxes in the table are found by one probe of the
primary key each, and the ages are the first and the last id to expire, one ``LIMIT 1`` each:
a reading costs the same on a table of a thousand ids as on one of ten million.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from outbox import inbox
from outbox._db import queries
from outbox.app import Outbox

__all__ = ["COUNT_CAP", "LISTED", "InboxStatus", "inboxes", "prune"]

COUNT_CAP = 100_000
"""Ids counted per inbox at most (and, apart, ids past their expiry): past it, a count says
"at least" (:attr:`InboxStatus.capped_at`)."""
LISTED = 1000
"""Inboxes the table is read for at most, past those the application declares: an inbox name
is a label of the metrics, and a table holding more was not filled by inboxes an operator
watches."""


@dataclass(frozen=True, slots=True)
class InboxStatus:
    """One inbox: how long it keeps an id, and what it keeps now. Ages are float seconds, by
    the database clock."""

    name: str
    declared: bool
    """Whether this application declares it (``app.inbox(name)``); an inbox whose ids were
    recorded by another application on the same database, or by one that no longer declares
    it, is listed too, its horizon unknown."""
    horizon: float | None
    """Seconds it keeps an id after receiving it; None when not declared here."""
    ids: int
    """Ids it keeps (a count that reached :attr:`capped_at`: at least that many)."""
    expired: int
    """Ids past their horizon that no prune has deleted yet: a few between two retention
    passes (every 10 minutes on the fleet's leader); many, or old ones, when nothing prunes
    (no ``outbox work``, no ``outbox prune``)."""
    oldest_age: float | None
    """Seconds since the id that expires first was received: the oldest id it keeps (unless
    its horizon was shortened since, when an id received later expires first); None when it
    keeps none."""
    newest_age: float | None
    """Seconds since the id that expires last was received."""
    next_expiry_in: float | None
    """Seconds until the next id expires and may be pruned (< 0: it expired that long ago
    and waits for a prune); None when it keeps none."""
    capped_at: int | None
    """The cap the counts were read with; None: exact counts."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``--json``)."""
        return asdict(self)


def inboxes(app: Outbox, count_cap: int | None = COUNT_CAP) -> list[InboxStatus]:
    """Every inbox ``app`` declares, and every other one ``outbox_inbox`` keeps ids of (up to
    :data:`LISTED`), by name, read on one connection.

    ``count_cap``: count each inbox's ids, and its ids past their expiry, no further than this
    (a bounded read, see the module's docstring); None: exact counts, which read every id of
    the inbox."""
    if count_cap is not None and (
        isinstance(count_cap, bool) or not isinstance(count_cap, int) or count_cap < 1
    ):
        raise ValueError(f"count_cap must be a whole number >= 1, got {count_cap!r}")
    declared = app.inboxes
    with app.engine.connect() as conn:
        names = set(declared) | set(queries.inbox_names(conn, LISTED))
        readings = {name: queries.read_inbox(conn, name, count_cap) for name in sorted(names)}
    return [
        InboxStatus(
            name=name,
            declared=name in declared,
            horizon=declared[name].horizon if name in declared else None,
            ids=reading.ids,
            expired=reading.expired,
            oldest_age=reading.oldest_age,
            newest_age=reading.newest_age,
            next_expiry_in=reading.next_expiry_in,
            capped_at=count_cap,
        )
        for name, reading in readings.items()
    ]


def prune(app: Outbox) -> int:
    """Delete the ids of every inbox past their horizon, a thousand a transaction
    (:func:`outbox.inbox.prune`); how many were deleted. What the fleet's retention pass and
    ``outbox prune`` do too: this is for when an operator will not wait for them."""
    return inbox.prune(app.engine)
