"""Where something is: one text, taken as each of what an operator has in hand (an event id, a
group id, an ordering key, a producer's ingest key), looked for in the buffers, the groups
with a job, the dead groups and the archive.

Every look is bounded, so that a search costs a few index probes however big the tables:
an event id by each buffer's primary key and among the newest :data:`ARCHIVE_SCAN` archived
events; a group id by the jobs' and the archive's group indexes; an ingest key by its primary
key; an ordering key by the held keys, the groups that have one (:func:`outbox.ops.groups.find`)
and, where the key column has an index of its own, the events not yet in a group. What was
not looked at is said in :attr:`SearchResult.notes`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Table, UniqueConstraint

from outbox import schema
from outbox._db import queries
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler
from outbox.ops import archive, groups
from outbox.ops.selection import Selection

__all__ = ["ARCHIVE_SCAN", "Found", "Place", "SearchResult", "Taken", "search"]

ARCHIVE_SCAN = archive.PAYLOAD_SCAN
"""Archived events an event id is looked for among (the newest): the archive has no index on
event ids."""
SHOWN = 50
"""The most places one reading of the text reports."""
TEXT_LIMIT = 400
"""The longest text searched: an ordering key as ``outbox_held_keys`` keeps it."""


class Taken(StrEnum):
    """What the text was taken as."""

    EVENT_ID = "event_id"
    GROUP_ID = "group_id"
    ORDERING_KEY = "ordering_key"
    INGEST_KEY = "ingest_key"


class Place(StrEnum):
    """Where it was found."""

    BUFFER = "buffer"
    """In its buffer, in no group yet: it waits to be claimed."""
    GROUP = "group"
    """In a group that has a job (the status says which: waiting, in flight, retrying...)."""
    DEAD = "dead"
    """In a dead (or held) group, in the archive: to replay or discard."""
    ARCHIVE = "archive"
    """Archived as succeeded, discarded, replayed or expired."""


@dataclass(frozen=True, slots=True)
class Found:
    """One place the text was found, as what it was taken for."""

    taken: Taken
    place: Place
    handler: str
    group_id: uuid.UUID | None = None
    event_id: int | None = None
    status: str | None = None
    """The group's status (a group), or the archived event's (the archive)."""
    events: int | None = None
    """Events of an ordering key in the buffer not yet in a group (at least, at the cap)."""


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Where a text was found, and where it was not looked for."""

    text: str
    found: list[Found]
    notes: list[str] = field(default_factory=list)


def search(app: Outbox, text: str) -> SearchResult:
    """Where ``text`` is, taken as an event id (a whole number), a group id (a UUID), an
    ordering key (of the handlers that have one) and a producer's ingest key, each where it
    can be; a :class:`~outbox.exceptions.ConfigurationError` for no text, a text longer than
    :data:`TEXT_LIMIT` or one with a NUL character (PostgreSQL's text holds none)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(f"text: expected an event id, a group id or a key, got {text!r}")
    text = text.strip()
    if len(text) > TEXT_LIMIT:
        raise ConfigurationError(f"text: at most {TEXT_LIMIT} characters, got {len(text)}")
    if "\x00" in text:
        raise ConfigurationError("text: holds a NUL character, which no id or key holds")
    found: list[Found] = []
    notes: list[str] = []
    with app.engine.connect() as conn:
        group_id = _uuid(text)
        if group_id is not None:
            found += _group(conn, group_id)
        if text.isdecimal() and int(text) < 2**63:
            found += _event(conn, int(text), Taken.EVENT_ID, list(app.handlers.values()))
            notes.append(f"event ids searched among the newest {ARCHIVE_SCAN:,} archived events")
        for name, event_id in queries.ingested_event(conn, list(app.handlers), text):
            where = _event(conn, event_id, Taken.INGEST_KEY, [app.get_handler(name)])
            found += where
            if not where:
                notes.append(
                    f"ingest key {text!r} of {name} wrote event {event_id}: no longer in its "
                    "buffer nor among the newest archived events (handled and not archived, "
                    "or pruned)"
                )
    # Outside the connection above: a listing reads on a connection of its own.
    for handler in app.handlers.values():
        if handler.ordering_key is not None:
            found += _key(app, handler, text, notes)
    return SearchResult(text, found, notes)


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _group(conn: Connection, group_id: uuid.UUID) -> list[Found]:
    """A group by its id: its job, or its dead events, or its archived ones."""
    row = queries.group_job(conn, group_id)
    if row is not None:
        return [Found(Taken.GROUP_ID, Place.GROUP, row.handler, group_id, status=row.status)]
    dead = queries.dead_groups(conn, queries.GroupFilter(group_ids=[group_id]), limit=1)
    if dead:
        return [Found(Taken.GROUP_ID, Place.DEAD, dead[0].handler, group_id, status=dead[0].status)]
    rows = queries.select_archived(
        conn, handler=None, statuses=None, group_id=group_id, after_id=0, limit=1
    )
    if not rows:
        return []
    return [
        Found(Taken.GROUP_ID, Place.ARCHIVE, rows[0]["handler"], group_id, status=status, events=n)
        for status, n in sorted(queries.archived_of_group(conn, group_id).items())
    ]


def _event(
    conn: Connection, event_id: int, taken: Taken, handlers: list[Handler[Any]]
) -> list[Found]:
    """An event by its id, in the buffers of ``handlers`` and among the newest archived."""
    found: list[Found] = []
    tables: set[str] = set()
    for handler in handlers:
        if handler.table.fullname in tables:
            continue
        tables.add(handler.table.fullname)
        for group_id in queries.buffer_event(conn, handler.table, event_id):
            if group_id is None:
                found.append(Found(taken, Place.BUFFER, handler.name, None, event_id))
                continue
            job = queries.group_job(conn, group_id)
            status = None if job is None else job.status
            found.append(Found(taken, Place.GROUP, handler.name, group_id, event_id, status))
    only = handlers[0].name if len(handlers) == 1 else None
    for row in queries.archived_events(
        conn, event_id, handler=only, scan=ARCHIVE_SCAN, limit=SHOWN
    ):
        dead = row["status"] == schema.ArchiveStatus.DEAD
        place = Place.DEAD if dead else Place.ARCHIVE
        found.append(Found(taken, place, row["handler"], row["group_id"], event_id, row["status"]))
    return found


def _key(app: Outbox, handler: Handler[Any], key: str, notes: list[str]) -> list[Found]:
    """A handler's ordering key: the dead group that holds it, the groups with an event of
    it, and its events not yet in a group where an index lets them be counted."""
    assert handler.ordering_key is not None
    found: list[Found] = []
    with app.engine.connect() as conn:
        held = queries.held_key_group(conn, handler.name, key)
    if held is not None:
        found.append(Found(Taken.ORDERING_KEY, Place.DEAD, handler.name, held, status="held"))
    listing = groups.find(app, Selection(handlers=(handler.name,), key=key), limit=SHOWN)
    for group in listing.groups:
        if group.group_id == held:
            continue
        dead = group.status in queries.ARCHIVED
        place = Place.DEAD if dead else Place.GROUP
        found.append(
            Found(Taken.ORDERING_KEY, place, handler.name, group.group_id, status=group.status)
        )
    table, column = handler.table, handler.ordering_key
    if not _indexed(table, column):
        notes.append(
            f"{table.name} has no index on {column}: its events not yet in a group were not "
            f"searched for the key ({handler.name}'s groups were)"
        )
        return found
    value = _typed(table, column, key)
    if value is None:
        return found
    with app.engine.connect() as conn:
        count = queries.count_unclaimed_with_key(conn, table, column, value, groups.COUNT_CAP)
    if count:
        found.append(Found(Taken.ORDERING_KEY, Place.BUFFER, handler.name, events=count))
    return found


def _indexed(table: Table, column: str) -> bool:
    """Whether an index (or a unique constraint, or the primary key) of the table's model
    begins with ``column``: then a key's rows are found without reading the table."""
    firsts = [list(index.columns)[:1] for index in table.indexes]
    firsts += [list(c.columns)[:1] for c in table.constraints if isinstance(c, UniqueConstraint)]
    firsts.append(list(table.primary_key.columns)[:1])
    return any(first and first[0].name == column for first in firsts)


def _typed(table: Table, column: str, text: str) -> Any:
    """``text`` as a value of the column's type, for the index to serve the comparison; None
    when it is not one (then no event has it)."""
    try:
        kind = table.c[column].type.python_type
    except NotImplementedError:
        return None
    try:
        if kind is bool:
            return None
        if kind in (int, Decimal, float):
            return kind(text)
        if kind is uuid.UUID:
            return uuid.UUID(text)
        if kind is str:
            return text
    except (ValueError, InvalidOperation):
        return None
    return None
