"""Flag handlers as an operator sees them (:meth:`outbox.Outbox.flagged`): each one's business
table, its flag and version, and the flagged rows on both sides of its buffer: those waiting
to be taken into it and those it holds the keys of (:func:`flag_tables`).

``outbox flags list``, ``outbox status``, ``GET /api/v1/flags``, the console's handler pages
and the Prometheus gauge ``outbox_flagged_rows`` ask :func:`flag_tables`, so that they agree.

*Why the business side needs reading.* The handler's own status (its buffer's backlog and
age, its groups, dead letters and held keys) says what outbox is working on; the rows flagged
and not taken yet are outside it. They wait while nothing distributes (no leader of ``outbox
work``, no ``outbox distribute``), and while more rows are flagged than one distribution takes
(50 groups of ``batch_size`` a tick).

*What a reading costs.* Three statements a handler, each stopping at a cap
(:data:`COUNT_CAP`, as the console's counts do: a count that reached it means at least that
many): the flagged rows, walked through the flag's index (the one the distribution's look
uses) with a probe of the buffer's unique ``row_id`` index each; the keys in the buffer, a walk
of its primary key; the held keys, a range of ``outbox_held_keys``'s primary key. A business
table of ten million rows, a million of them flagged, costs a reading what one of a thousand
does.

*One table that cannot be read* (not created yet, a flag column not migrated, a privilege
missing) is said in its handler's reading (:attr:`FlagStatus.error`) and the others are read:
a deploy half done must not hide the flag handlers it did not touch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox._db import queries
from outbox.app import Outbox
from outbox.handler import Handler
from outbox.ops import database

__all__ = ["COUNT_CAP", "FlagStatus", "flag_handlers", "flag_tables"]

COUNT_CAP = 100_000
"""Rows counted per reading at most (flagged rows, keys in the buffer, held keys): past it, a
count says "at least" (:attr:`FlagStatus.capped_at`)."""


@dataclass(frozen=True, slots=True)
class FlagStatus:
    """One flag handler: where its rows come from, and how many wait on each side of its
    buffer. Counts are None when :attr:`error` says why they could not be read."""

    handler: str
    table: str
    """The business table (``schema.table`` when it has a schema)."""
    flag: str
    """The flag column: a boolean, or a nullable column set when the row needs work."""
    version: str
    """The column whose value tells one change of a row from the next (the flag itself for
    a nullable flag): a flag is cleared only where it is still the one the key was taken
    with."""
    buffer: str
    """The handler's buffer (a ``FlaggedRowsMixin`` table): the keys of the rows outbox is
    working on."""
    flagged: int | None
    """Rows of the business table whose flag is set (a count that reached
    :attr:`capped_at`: at least that many)."""
    waiting: int | None
    """Of the flagged rows, those whose key the buffer does not hold: not taken yet, the next
    distribution takes them (at most 50 groups of ``batch_size`` at a time). Past the cap, of the
    flagged rows with the highest keys, the ones the distribution takes last: at least that
    many."""
    taken: int | None
    """Of the flagged rows counted, those whose key the buffer holds: being worked on
    (``flagged - waiting``)."""
    keys: int | None
    """Keys in the buffer, waiting for a claim or in groups: the handler's backlog, rows
    whose flag the application has cleared since their key was taken included."""
    held: int | None
    """Keys held by dead rows: their rows stay flagged and no claim takes them until an
    operator releases them (``outbox held list``, ``outbox held release``)."""
    capped_at: int | None
    """The cap the counts were read with; None: exact counts."""
    error: str | None = None
    """Why the handler's tables could not be read (one line, the database's); None when they
    were."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``--json``)."""
        return asdict(self)


def flag_handlers(app: Outbox, handlers: Collection[str] = ()) -> list[Handler[Any]]:
    """The flag handlers of ``app`` (those of ``handlers`` only, when given: the selection of
    ``outbox status --handler``), by name."""
    chosen = app.select_handlers(list(handlers))
    return sorted((h for h in chosen if h.flags is not None), key=lambda h: h.name)


def flag_tables(
    app: Outbox, count_cap: int | None = COUNT_CAP, handlers: Collection[str] = ()
) -> list[FlagStatus]:
    """Every flag handler of ``app`` (those of ``handlers`` only, when given), by name: its
    business table, flag and version, its buffer, the flagged rows and of those the ones not
    taken yet, the keys in its buffer and the keys held by dead rows, read on one connection.

    ``count_cap``: count each no further than this (a bounded read, see the module's
    docstring); None: exact counts, which read every flagged row. A database error reading
    one handler's tables is said in its :attr:`FlagStatus.error` and the others are read; a
    connection lost is raised."""
    if count_cap is not None and (
        isinstance(count_cap, bool) or not isinstance(count_cap, int) or count_cap < 1
    ):
        raise ValueError(f"count_cap must be a whole number >= 1, got {count_cap!r}")
    found = flag_handlers(app, handlers)
    if not found:
        return []
    with app.engine.connect() as conn:
        return [_reading(conn, handler, count_cap) for handler in found]


def _reading(conn: Connection, handler: Handler[Any], cap: int | None) -> FlagStatus:
    source = handler.flags
    assert source is not None  # flag_handlers keeps only these
    rows: queries.FlaggedCount | None = None
    keys = held = None
    error = None
    try:
        rows = queries.count_flagged_rows(conn, handler.table, source.table, source.flagged(), cap)
        keys = queries.count_buffer_rows(conn, handler.table, unclaimed=None, cap=cap)
        held = queries.count_held_keys(conn, handler.name, cap)
    except DBAPIError as failed:
        if failed.connection_invalidated:
            raise
        # The failed statement ends the transaction on PostgreSQL: the next handler's
        # statements begin a new one.
        conn.rollback()
        rows = keys = held = None
        error = database.error_summary(failed)
    return FlagStatus(
        handler=handler.name,
        table=source.table.fullname,
        flag=source.flag,
        version=source.version,
        buffer=handler.table.fullname,
        flagged=None if rows is None else rows.flagged,
        waiting=None if rows is None else rows.waiting,
        taken=None if rows is None else rows.flagged - rows.waiting,
        keys=keys,
        held=held,
        capped_at=cap,
        error=error,
    )
