"""Groups as an operator sees them: which there are and where each stands (:func:`find`), and
one group in full (:func:`show`).

The command line, the dashboard and the HTTP API ask these functions, so that they always
agree. Each takes a selection (:class:`~outbox.ops.selection.Selection`). Listings read a page at
a time and count up to a cap (:data:`COUNT_CAP`): a question about a huge table costs a bounded
amount of work, and a capped count says so. The writes on groups (retry, replay, discard) are
:mod:`outbox.ops.group_operations`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from outbox import schema
from outbox._db import queries
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError, GroupNotFoundError
from outbox.handler import Handler
from outbox.ops.archive import readable_values
from outbox.ops.selection import Selection
from outbox.schema import GroupStatus

__all__ = [
    "COUNT_CAP",
    "DEFAULT_LIMIT",
    "Attempt",
    "Event",
    "Group",
    "GroupDetail",
    "Lease",
    "Listing",
    "find",
    "show",
]

DEFAULT_LIMIT = 50
"""Groups a listing shows unless told otherwise."""
MAX_LIMIT = 1000
"""The most groups one listing reads: a larger page is many pages."""
COUNT_CAP = 10_000
"""A listing counts the groups it matches up to this many; past it, the count is said to be
capped (at least this many)."""
SHOWN_EVENTS = 200
"""Events :func:`show` reads of a group; the rest are counted."""
SHOWN_ATTEMPTS = 50
"""Attempts :func:`show` reads of a group (the latest)."""


@dataclass(frozen=True, slots=True)
class Group:
    """A group and where it stands."""

    handler: str
    group_id: uuid.UUID
    status: GroupStatus | schema.ArchiveStatus
    """Where it stands; a group that is done (shown by :func:`show` only): the status its
    events were archived with."""
    attempts: int
    """Attempts that ended (a group in flight: with the one under way)."""
    deferrals: int
    """Attempts put off for the downstream's ``Retry-After``."""
    events: int
    """Its events: in its buffer, or (dead) in the archive."""
    age: float
    """Seconds since it was made; dead or done: since it was archived (a group delivered by a
    handler that does not archive: since its last recorded attempt ended)."""
    due_in: float | None
    """Seconds until its next run (< 0: overdue); None in flight, refused or dead."""
    worker: str | None
    """The worker that holds it (in flight)."""
    error: str | None
    """Its last error, with traceback."""


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of groups, and how many the selection matches by status."""

    groups: list[Group]
    counts: dict[GroupStatus, int]
    capped: bool
    """The counts stopped at :data:`COUNT_CAP`: there are at least that many."""
    next: str | None = None
    """The cursor of the next page (``find(..., after=next)``); None on the last."""

    @property
    def total(self) -> int:
        """The groups the selection matches (at least, when ``capped``)."""
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class Event:
    """An event of a group: its id and values (dead: as archived, with its error)."""

    id: int
    values: dict[str, Any]
    status: str | None = None
    """Archived: its :class:`~outbox.schema.ArchiveStatus`; None while in its buffer."""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt of a group that did not end in success."""

    attempt: int
    outcome: schema.AttemptOutcome
    worker: str | None
    error: str | None
    age: float
    """Seconds since it ended."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a group now, and how lately it was heard from."""

    worker: str | None
    expires_in: float | None
    """Seconds until the lease runs out (< 0: ran out, to be rescued); None: held as refused."""
    heartbeat_age: float | None
    """Seconds since the holder's last heartbeat; None: no worker row (gone, or a test)."""


@dataclass(frozen=True, slots=True)
class GroupDetail:
    """One group in full: where it stands, its events, its attempts, its lease."""

    group: Group
    events: list[Event]
    attempts: list[Attempt]
    lease: Lease | None
    archived: dict[str, int] = field(default_factory=dict)
    """Its events in the archive by status (a group bisected may have some succeeded)."""

    @property
    def delivered_unarchived(self) -> bool:
        """Delivered by a handler that does not archive: its events are gone, and what is
        known of it is its attempts that did not succeed."""
        return self.group.status == schema.ArchiveStatus.SUCCEEDED and not self.archived

    @property
    def more_events(self) -> int:
        """Events of the group not read (past :data:`SHOWN_EVENTS`)."""
        known = (
            self.group.events if self.group.status in queries.LIVE else sum(self.archived.values())
        )
        return max(known - len(self.events), 0)


def _handlers(app: Outbox, selection: Selection) -> list[Handler[Any]]:
    handlers = [app.get_handler(name) for name in selection.handlers] or list(app.handlers.values())
    if selection.key is not None:
        ordered = [h for h in handlers if h.ordering_key is not None]
        if not ordered:
            raise ConfigurationError(
                "key: no handler selected has an ordering_key to match it against "
                f"({', '.join(h.name for h in handlers) or 'no handlers'})"
            )
        return ordered
    return handlers


def _group_ids(
    conn: Connection, handlers: list[Handler[Any]], selection: Selection
) -> list[uuid.UUID] | None:
    """The group ids the selection names, with those its key matches; None: any."""
    if selection.key is None:
        return list(selection.group_ids) or None
    found: list[uuid.UUID] = []
    for handler in handlers:
        assert handler.ordering_key is not None
        found += queries.groups_with_key(
            conn, handler.table, handler.ordering_key, handler.name, selection.key, COUNT_CAP
        )
    if selection.group_ids:
        found = [g for g in found if g in selection.group_ids]
    return found


def find(
    app: Outbox,
    selection: Selection | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    after: str | None = None,
) -> Listing:
    """The groups ``selection`` matches (all, without one): those with a job first, oldest
    first, then dead ones, the longest dead first; at most ``limit``, after the cursor
    ``after`` (a listing's ``next``); and how many it matches by status, up to
    :data:`COUNT_CAP`."""
    selection = Selection() if selection is None else selection
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(f"limit: expected 1 to {MAX_LIMIT} groups, got {limit!r}")
    phase, position = _cursor(after)
    handlers = _handlers(app, selection)
    by_name = {h.name: h for h in handlers}
    with app.engine.connect() as conn:
        group_ids = _group_ids(conn, handlers, selection)
        if group_ids == []:
            return Listing([], {}, False)
        statuses = selection.statuses or tuple(GroupStatus)
        live_statuses = [s.value for s in statuses if s.value in queries.LIVE]
        dead_statuses = [s.value for s in statuses if s.value in queries.ARCHIVED]
        # A payload is searched in the archive only: dead groups' events are there.
        if selection.payload is not None:
            live_statuses = []
        common: dict[str, Any] = {
            "handlers": list(by_name),
            "older_than": selection.older_than,
            "error": selection.error,
            "group_ids": group_ids,
        }
        live = queries.GroupFilter(statuses=live_statuses, **common)
        dead = queries.GroupFilter(statuses=dead_statuses, payload=selection.payload, **common)
        rows: list[queries.GroupRow] = []
        if live_statuses and phase == _LIVE:
            rows += queries.live_groups(conn, live, after=position, limit=limit + 1)
        if dead_statuses and len(rows) <= limit:
            rows += queries.dead_groups(
                conn,
                dead,
                after=position if phase == _DEAD else None,
                limit=limit + 1 - len(rows),
            )
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1]
            next_cursor = f"{_DEAD if last.status in queries.ARCHIVED else _LIVE}:{last.position}"
        counts: dict[str, int] = {}
        if live_statuses:
            counts.update(queries.count_live_groups(conn, live, cap=COUNT_CAP))
        if dead_statuses:
            counts.update(queries.count_dead_groups(conn, dead, cap=COUNT_CAP))
        events = _event_counts(conn, by_name, rows)
    groups = [_group(row, events.get(row.group_id, 0)) for row in rows]
    capped = any(n >= COUNT_CAP for n in counts.values())
    return Listing(groups, {GroupStatus(s): n for s, n in counts.items() if n}, capped, next_cursor)


_LIVE = "live"
_DEAD = "dead"


def _cursor(after: str | None) -> tuple[str, int | None]:
    """A listing's cursor as (phase, position); None: from the start."""
    if after is None:
        return _LIVE, None
    phase, _, position = after.partition(":") if isinstance(after, str) else ("", "", "")
    if phase not in (_LIVE, _DEAD) or not position.isdecimal() or int(position) >= 2**63:
        raise ConfigurationError(f"after: {after!r} is not a listing's cursor (its `next`)")
    return phase, int(position)


def _event_counts(
    conn: Connection, handlers: Mapping[str, Handler[Any]], rows: list[queries.GroupRow]
) -> dict[uuid.UUID, int]:
    counts: dict[uuid.UUID, int] = {}
    dead = [r.group_id for r in rows if r.status in queries.ARCHIVED]
    if dead:
        counts.update(queries.count_dead_events(conn, dead))
    by_handler: dict[str, list[uuid.UUID]] = {}
    for row in rows:
        if row.status not in queries.ARCHIVED:
            by_handler.setdefault(row.handler, []).append(row.group_id)
    for name, ids in by_handler.items():
        counts.update(queries.count_events_of_groups(conn, handlers[name].table, ids))
    return counts


def _group(row: queries.GroupRow, events: int) -> Group:
    return Group(
        handler=row.handler,
        group_id=row.group_id,
        status=GroupStatus(row.status),
        attempts=row.attempts,
        deferrals=row.deferrals,
        events=events,
        age=row.age,
        due_in=row.due_in,
        worker=row.worker,
        error=row.error,
    )


def show(app: Outbox, group_id: uuid.UUID) -> GroupDetail:
    """One group in full: where it stands, its events (the first :data:`SHOWN_EVENTS`), the
    attempts of it that did not end in success, and who holds it. A group with neither a job
    nor a dead event is shown from the archive, with the status its events were archived with;
    one with no archived event either but recorded attempts was delivered by a handler that
    does not archive: ``succeeded``, with no events and ``archived`` empty. One outbox has no
    trace of raises :class:`~outbox.exceptions.GroupNotFoundError`."""
    if not isinstance(group_id, uuid.UUID):
        raise ConfigurationError(f"group_id: expected a UUID, got {type(group_id).__name__}")
    with app.engine.connect() as conn:
        row = queries.group_job(conn, group_id)
        archived = queries.archived_of_group(conn, group_id)
        recorded = queries.group_attempts(conn, group_id, SHOWN_ATTEMPTS)
        attempts = [
            Attempt(a.attempt, schema.AttemptOutcome(a.outcome), a.worker, a.error, a.age)
            for a in recorded
        ]
        lease = None
        if row is not None:
            handler = app.get_handler(row.handler)
            values = queries.select_group_rows(conn, handler.table, group_id, SHOWN_EVENTS)
            events = [Event(int(v.id), _values(v._mapping)) for v in values]
            held = queries.lease_of(conn, group_id)
            if held is not None:
                lease = Lease(row.worker, held[0], held[1])
            count = queries.count_events_of_groups(conn, handler.table, [group_id])
            group = _group(row, count.get(group_id, 0))
        else:
            dead = queries.dead_groups(conn, queries.GroupFilter(group_ids=[group_id]), limit=1)
            rows = queries.select_archived(
                conn,
                handler=None,
                statuses=None,
                group_id=group_id,
                after_id=0,
                limit=SHOWN_EVENTS,
            )
            if not dead and not rows and not attempts:
                raise GroupNotFoundError(group_id)
            events = [
                Event(
                    int(r["event_id"]),
                    _values(readable_values(app, r["handler"], r["payload"])),
                    r["status"],
                    r["error"],
                )
                for r in rows
            ]
            if dead:
                group = _group(dead[0], archived.get(schema.ArchiveStatus.DEAD, 0))
            else:
                age = queries.archived_age(conn, group_id)
                handler_name = rows[0]["handler"] if rows else recorded[-1].handler
                group = _done_group(group_id, handler_name, age, rows, attempts, archived)
    return GroupDetail(group, events, attempts, lease, archived)


def _values(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("id", "group_id")}


def _done_group(
    group_id: uuid.UUID,
    handler: str,
    archived_age: float | None,
    rows: list[dict[str, Any]],
    attempts: list[Attempt],
    archived: dict[str, int],
) -> Group:
    """A group that is done (succeeded, discarded, replayed...): its status is the one most
    of its events were archived with, superseded ones aside. One known only by its attempts
    has neither a job (so it is not live) nor an archived event (so it is not dead, discarded
    or expired: those are always archived): its handler deleted its events once delivered,
    without archiving."""
    # Superseded events are archived only when their group succeeded: they say nothing else
    # of it (with archive=False they are all its handler kept).
    told = {s: n for s, n in archived.items() if s != schema.ArchiveStatus.SUPERSEDED}
    most = max(told.items(), key=lambda item: item[1])[0] if told else "succeeded"
    status: GroupStatus | schema.ArchiveStatus = schema.ArchiveStatus(most)
    return Group(
        handler=handler,
        group_id=group_id,
        status=status,
        attempts=max([int(r["attempts"]) for r in rows] + [a.attempt for a in attempts] + [0]),
        deferrals=0,
        events=sum(archived.values()),
        age=archived_age if archived_age is not None else attempts[-1].age,
        due_in=None,
        worker=None,
        error=rows[0]["error"] if rows else (attempts[-1].error if attempts else None),
    )
