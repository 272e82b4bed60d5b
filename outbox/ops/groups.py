"""Groups as an operator sees them: which there are and where each stands, one group in full,
running waiting groups now (retry) and giving groups up (discard).

The command line, the dashboard and the HTTP API ask these functions, so that they always
agree. A *selection* (:class:`Selection`) is the filter every one of them takes: handlers,
statuses (:class:`outbox.schema.GroupStatus`), age, error text, ordering key, payload text,
group ids. Listings read a page at a time and count up to a cap (:data:`COUNT_CAP`): a question
about a huge table costs a bounded amount of work, and a capped count says so.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._core import log as _log
from outbox._core.checks import text_problem
from outbox._db import queries, run_in_transaction
from outbox.app import Handler, Outbox
from outbox.exceptions import ConfigurationError, GroupNotFoundError
from outbox.ops import operators
from outbox.ops.operators import checked_actor
from outbox.ops.progress import Phase, Progress
from outbox.schema import GroupStatus

__all__ = [
    "COUNT_CAP",
    "DEFAULT_LIMIT",
    "RETRIED",
    "Attempt",
    "Event",
    "Group",
    "GroupDetail",
    "Lease",
    "Listing",
    "OperationResult",
    "Selection",
    "discard",
    "find",
    "parse_statuses",
    "replay",
    "replay_group",
    "retry",
    "show",
]

log = _log.get_logger(__name__)

MAX_AGE_SECONDS = 100 * 365.25 * 86_400
"""The oldest ``older_than`` a selection takes: further back, the time is past what every
database computes."""
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
DISCARD_PAGE = 200
"""Groups a discard gives up per transaction."""
REPLAY_PAGE = 100
"""Groups a replay takes at a time (each a few transactions: one per chunk of events);
a replay stopped between two such pages has replayed every group before wholly."""
RETRY_PAGE = 200
"""Groups a retry makes due per transaction."""

_NOT_DISCARDED = frozenset({GroupStatus.IN_FLIGHT})
_REPLAY = schema.OperationAction.REPLAY
RETRIED = (GroupStatus.WAITING, GroupStatus.RETRYING, GroupStatus.DEFERRED)
"""The statuses of a group :func:`retry` makes due now."""
# Why retry leaves a group of each other status: what does move it, in words.
_NOT_RETRIED = {
    GroupStatus.IN_FLIGHT: "in flight: a worker holds it",
    GroupStatus.PAUSED: "paused: its handler is paused (resume it)",
    GroupStatus.REFUSED: "refused: release it once the cause is fixed",
    GroupStatus.HELD: "held: dead, replay it",
    GroupStatus.DEAD: "dead: replay it",
}


def parse_statuses(words: Iterable[str], *, argument: str = "status") -> tuple[GroupStatus, ...]:
    """Words as :class:`~outbox.schema.GroupStatus` values (``in-flight`` and ``in_flight``
    alike); a :class:`~outbox.exceptions.ConfigurationError` naming ``argument`` and the
    accepted words for any other."""
    known = {s.value: s for s in GroupStatus}
    found = []
    for word in words:
        if not isinstance(word, str):
            raise ConfigurationError(f"{argument}: expected a word, got {type(word).__name__}")
        status = known.get(word.strip().lower().replace("-", "_"))
        if status is None:
            raise ConfigurationError(
                f"{argument}: {word!r} is not a group status; expected one of {', '.join(known)}"
            )
        found.append(status)
    return tuple(dict.fromkeys(found))


def _text(value: str | None, argument: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{argument}: expected some text, got {value!r}")
    problem = text_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{argument}: {problem}")
    return value


@dataclass(frozen=True, slots=True)
class Selection:
    """Which groups: each field narrows the selection; left empty, it does not.

    ``statuses``: :class:`~outbox.schema.GroupStatus` values or their words; ``older_than``:
    seconds since the group was made (a dead one: since it was archived); ``error``: text in
    its last error, any case; ``key``: an ordering key's value, as text (handlers with an
    ``ordering_key`` only); ``payload``: text in a dead event's payload, any case.
    """

    handlers: tuple[str, ...] = ()
    statuses: tuple[GroupStatus, ...] = ()
    older_than: float | None = None
    error: str | None = None
    key: str | None = None
    payload: str | None = None
    group_ids: tuple[uuid.UUID, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.handlers, str) or not all(isinstance(h, str) for h in self.handlers):
            raise ConfigurationError("handlers: expected a tuple of handler names")
        object.__setattr__(self, "handlers", tuple(self.handlers))
        object.__setattr__(self, "statuses", parse_statuses(self.statuses, argument="statuses"))
        if self.older_than is not None and (
            isinstance(self.older_than, bool)
            or not isinstance(self.older_than, int | float)
            # Infinite or NaN: no time the database can subtract from now.
            or not 0 <= self.older_than < math.inf
        ):
            raise ConfigurationError(
                f"older_than: expected a finite number of seconds >= 0, got {self.older_than!r}"
            )
        if self.older_than is not None and self.older_than > MAX_AGE_SECONDS:
            raise ConfigurationError(
                f"older_than: expected at most {MAX_AGE_SECONDS:.0f} seconds (100 years),"
                f" got {self.older_than!r}"
            )
        _text(self.error, "error")
        _text(self.key, "key")
        _text(self.payload, "payload")
        ids = tuple(self.group_ids)
        if not all(isinstance(g, uuid.UUID) for g in ids):
            raise ConfigurationError("group_ids: expected UUIDs")
        object.__setattr__(self, "group_ids", ids)

    @property
    def empty(self) -> bool:
        """Nothing narrows it: every group."""
        return self == Selection()

    def as_json(self) -> str:
        """The selection as JSON, as an operation records it."""
        given: dict[str, Any] = {
            "handlers": list(self.handlers),
            "statuses": [s.value for s in self.statuses],
            "older_than": self.older_than,
            "error": self.error,
            "key": self.key,
            "payload": self.payload,
            "group_ids": [str(g) for g in self.group_ids],
        }
        return json.dumps({k: v for k, v in given.items() if v not in (None, [])}, sort_keys=True)


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


@dataclass(frozen=True, slots=True)
class OperationResult:
    """What a replay or a discard did (``dry_run``: would do)."""

    action: schema.OperationAction
    groups: list[Group]
    """The groups it took."""
    events: int
    skipped: list[tuple[Group, str]] = field(default_factory=list)
    """Groups selected but left, each with why."""
    dry_run: bool = False
    operation_id: int | None = None
    """The record of it (:func:`outbox.ops.archive.history`); None for a dry run."""


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
    if phase not in (_LIVE, _DEAD) or not position.isdigit() or int(position) >= 2**63:
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
    from outbox.ops.archive import parse_payload

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
                    _archived_values(parse_payload, r["payload"]),
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


def _archived_values(parse: Any, payload: str | None) -> dict[str, Any]:
    try:
        parsed: dict[str, Any] = parse(payload)
    except (ValueError, RecursionError) as error:
        return {"(unreadable payload)": f"{type(error).__name__}: {error}"}
    return _values(parsed)


def _done_group(
    group_id: uuid.UUID,
    handler: str,
    archived_age: float | None,
    rows: list[dict[str, Any]],
    attempts: list[Attempt],
    archived: dict[str, int],
) -> Group:
    """A group that is done (succeeded, discarded, replayed...): its status is the one most
    of its events were archived with. One known only by its attempts has neither a job (so it
    is not live) nor an archived event (so it is not dead, discarded or expired: those are
    always archived): its handler deleted its events once delivered, without archiving."""
    most = max(archived.items(), key=lambda item: item[1])[0] if archived else "succeeded"
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


def discard(
    app: Outbox,
    selection: Selection,
    *,
    actor: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
    page_size: int = DISCARD_PAGE,
    progress: Progress | None = None,
) -> OperationResult:
    """Give up the groups ``selection`` matches: never handled again, their events archived
    as discarded (dead ones: marked discarded, and the ordering keys they hold released).

    A group in flight is left alone (a worker holds it): it is named in ``skipped``. The
    selection must narrow something: an empty one is refused. Recorded as an operation by
    ``actor`` (default: :func:`outbox.ops.operators.default_actor`), with ``reason``.

    Groups are discarded ``page_size`` (:data:`DISCARD_PAGE`) per transaction, which also adds
    them to the operation's record. ``progress`` (:class:`~outbox.ops.progress.Progress`) is told
    the groups to discard (counted up to :data:`COUNT_CAP`) and each page discarded; when it
    asks to stop, :class:`~outbox.ops.progress.StoppedError` is raised between two pages.
    """
    _narrowing(selection, "discard")
    _text(reason, "reason")
    _page_size(page_size)
    actor = checked_actor(actor)
    taken: list[Group] = []
    skipped: list[tuple[Group, str]] = []
    events = 0
    operation_id: int | None = None
    after: str | None = None
    phase: Phase | None = None
    while True:
        listing = find(app, selection, limit=page_size, after=after)
        if phase is None:
            reported = None if dry_run else progress
            phase = Phase(reported, "discarded", "groups", _to_take(listing, _NOT_DISCARDED))
        phase.check(operation_id)
        page = listing.groups
        chosen = [g for g in page if g.status not in _NOT_DISCARDED]
        skipped += [(g, "in flight: a worker holds it") for g in page if g not in chosen]
        if dry_run:
            taken += chosen
            events += _count_events(chosen)
        elif chosen:
            if operation_id is None:
                operation_id = operators.record(
                    app, schema.OperationAction.DISCARD, actor, selection.as_json(), reason
                )
            done, gone = _discard_page(app, chosen, operation_id, actor, reason)
            taken += done
            skipped += [(g, "in flight: a worker took it") for g in gone]
            events += _count_events(done)
            phase.advance(len(done))
        if listing.next is None:
            break
        after = listing.next
    phase.end()
    if operation_id is not None:
        log.info(
            _log.GROUPS_DISCARDED,
            groups=len(taken),
            events=events,
            actor=actor,
            operation=operation_id,
        )
    return OperationResult(
        schema.OperationAction.DISCARD, taken, events, skipped, dry_run, operation_id
    )


def replay(
    app: Outbox,
    selection: Selection,
    *,
    actor: str | None = None,
    dry_run: bool = False,
    page_size: int = REPLAY_PAGE,
    chunk: int | None = None,
    progress: Progress | None = None,
    new_ids: bool = False,
) -> OperationResult:
    """Replay the dead groups ``selection`` matches (held ones too): every event of each goes
    back into its buffer, under its own id unless ``new_ids``, as
    :func:`outbox.ops.archive.replay` does, recorded as one operation by ``actor``. Groups of
    other statuses it matches are not dead: they are named in ``skipped``. The selection must
    narrow something: an empty one is refused.

    Groups are replayed ``page_size`` (:data:`REPLAY_PAGE`) at a time, their events ``chunk``
    per transaction (:data:`outbox.ops.archive.REPLAY_CHUNK` unless given). ``progress``
    (:class:`~outbox.ops.progress.Progress`) is told the groups to replay (counted up to
    :data:`COUNT_CAP`) and each page replayed; when it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two pages, every group before
    wholly replayed and recorded."""
    from outbox.ops import archive

    _narrowing(selection, "replay")
    _page_size(page_size)
    taken: list[Group] = []
    skipped: list[tuple[Group, str]] = []
    events = 0
    operation_id: int | None = None
    after: str | None = None
    phase: Phase | None = None
    while True:
        listing = find(app, selection, limit=MAX_LIMIT, after=after)
        if phase is None:
            live = frozenset(GroupStatus(s) for s in queries.LIVE)
            phase = Phase(None if dry_run else progress, "replayed", "dead groups",
                          _to_take(listing, live))  # fmt: skip
        dead = [g for g in listing.groups if g.status in queries.ARCHIVED]
        skipped += [
            (g, f"{g.status}: not dead") for g in listing.groups if g.status not in queries.ARCHIVED
        ]
        if dry_run:
            events += _count_events(dead)
            taken += dead
        # A page at a time, into one operation: a replay of many groups neither passes the
        # database more parameters than it takes nor records many operations.
        for start in range(0, 0 if dry_run else len(dead), page_size):
            phase.check(operation_id)
            page = dead[start : start + page_size]
            if operation_id is None:
                given = selection.as_json()
                if new_ids:
                    given = json.dumps({**json.loads(given), "new_ids": True}, sort_keys=True)
                operation_id = operators.record(app, _REPLAY, checked_actor(actor), given)
            done = archive.replay(
                app,
                group_ids=[g.group_id for g in page],
                status=schema.ArchiveStatus.DEAD,
                operation_id=operation_id,
                chunk=archive.REPLAY_CHUNK if chunk is None else chunk,
                new_ids=new_ids,
            )
            events += done.events
            taken += page
            phase.advance(len(page))
        if listing.next is None:
            break
        after = listing.next
    phase.end()
    return OperationResult(_REPLAY, taken, events, skipped, dry_run, operation_id)


def replay_group(
    app: Outbox, group_id: uuid.UUID, *, actor: str | None = None, dry_run: bool = False
) -> OperationResult:
    """Replay one group, as its console page and ``POST /groups/{group_id}/replay`` do: a
    dead (or held) one as :func:`replay` does; a discarded one (its downstream refused its
    events for good, and their cause is fixed now), every event of it archived as discarded,
    each under its own id, as ``outbox replay --group`` does. Either is recorded as one replay
    by ``actor``. A group of another status is named in ``skipped``, and nothing is done."""
    from outbox.ops import archive

    group = show(app, group_id).group
    if group.status in queries.ARCHIVED:
        return replay(app, Selection(group_ids=(group_id,)), actor=actor, dry_run=dry_run)
    if group.status != schema.ArchiveStatus.DISCARDED:
        why = f"{group.status}: not dead or discarded"
        return OperationResult(_REPLAY, [], 0, [(group, why)], dry_run)
    done = archive.replay(
        app,
        group_ids=[group_id],
        status=schema.ArchiveStatus.DISCARDED,
        actor=actor,
        dry_run=dry_run,
    )
    taken = [group] if done.events else []
    return OperationResult(_REPLAY, taken, done.events, [], dry_run, done.operation_id)


def _page_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_LIMIT:
        raise ConfigurationError(f"page_size: expected 1 to {MAX_LIMIT} groups, got {size!r}")


def _to_take(listing: Listing, left: frozenset[GroupStatus]) -> int | None:
    """The groups a selection's first page counted, but those of the statuses ``left``: how
    many an operation is about to take; None past :data:`COUNT_CAP`."""
    if listing.capped:
        return None
    return sum(n for status, n in listing.counts.items() if status not in left)


def retry(
    app: Outbox,
    selection: Selection,
    *,
    actor: str | None = None,
    dry_run: bool = False,
) -> OperationResult:
    """Run now the groups ``selection`` matches that wait for a retry or a deferral (waiting
    ones too): each job made due now, its attempts and deferrals still counted, so that a
    worker takes it at its next poll. Recorded as an operation by ``actor`` (default:
    :func:`outbox.ops.operators.default_actor`).

    Groups of other statuses are left, each named in ``skipped`` with why: in flight (a worker
    holds it), paused (its handler is), refused (released by :func:`outbox.ops.refused.release`),
    dead or held (replayed by :func:`replay`). The selection must narrow something: an empty
    one is refused.
    """
    _narrowing(selection, "retry")
    actor = checked_actor(actor)
    action = schema.OperationAction.RETRY
    taken: list[Group] = []
    skipped: list[tuple[Group, str]] = []
    operation_id: int | None = None
    after: str | None = None
    while True:
        listing = find(app, selection, limit=RETRY_PAGE, after=after)
        chosen = [g for g in listing.groups if g.status in RETRIED]
        skipped += [
            (g, _NOT_RETRIED[GroupStatus(g.status)])
            for g in listing.groups
            if g.status not in RETRIED
        ]
        if dry_run:
            taken += chosen
        elif chosen:
            if operation_id is None:
                operation_id = operators.record(app, action, actor, selection.as_json())
            done, gone = _retry_page(app, chosen)
            taken += done
            skipped += [(g, "in flight: a worker took it") for g in gone]
            operators.finish(app, operation_id, len(done), _count_events(done))
        if listing.next is None:
            break
        after = listing.next
    events = _count_events(taken)
    if operation_id is not None:
        log.info(
            _log.GROUPS_RETRIED,
            groups=len(taken),
            events=events,
            actor=actor,
            operation=operation_id,
        )
    return OperationResult(action, taken, events, skipped, dry_run, operation_id)


def _retry_page(app: Outbox, groups: list[Group]) -> tuple[list[Group], list[Group]]:
    """Make a page of groups due now in one transaction; those done, and those a worker took
    in the meantime. Idle workers are woken where the database can."""

    def work(conn: Connection) -> tuple[list[Group], list[Group]]:
        done: list[Group] = []
        gone: list[Group] = []
        for group in groups:
            (done if queries.retry_job_now(conn, group.group_id) else gone).append(group)
        if done and app.supports.listen_notify:
            queries.notify_jobs(conn)
        return done, gone

    return run_in_transaction(app.engine, work)


def _narrowing(selection: Selection, verb: str) -> None:
    """Refuse what is not a selection, or one that takes every group."""
    if not isinstance(selection, Selection):
        raise ConfigurationError(f"selection: expected a Selection, got {type(selection).__name__}")
    if selection.empty:
        raise ConfigurationError(
            f"{verb} needs a selection: a handler, statuses, an age, error text, a key or groups"
        )


def _count_events(groups: list[Group]) -> int:
    return sum(g.events for g in groups)


def _discard_page(
    app: Outbox, groups: list[Group], operation_id: int, actor: str, reason: str | None
) -> tuple[list[Group], list[Group]]:
    """Discard a page of groups in one transaction, which also adds them to the operation's
    record (so that the record counts what was done, however the command ends); those done,
    and those a worker took in the meantime."""
    error = f"discarded by {actor}" + (f": {reason}" if reason else "")

    def work(conn: Connection, lenient: bool) -> tuple[list[Group], list[Group]]:
        done, gone = [], []
        for group in groups:
            if group.status in queries.ARCHIVED:
                queries.discard_dead_rows(conn, [group.group_id], operation_id)
                queries.release_held_keys(conn, group.handler, group_id=group.group_id)
                done.append(group)
                continue
            if not queries.delete_idle_job(conn, group.group_id):
                gone.append(group)
                continue
            table = app.get_handler(group.handler).table
            queries.archive_group_rows(
                conn,
                app.dialect,
                table,
                handler=group.handler,
                group_id=group.group_id,
                status=schema.ArchiveStatus.DISCARDED.value,
                attempts=group.attempts,
                error=error,
                lenient=lenient,
            )
            queries.mark_group_operation(conn, group.group_id, operation_id)
            queries.delete_group_rows(conn, table, group.group_id)
            done.append(group)
        queries.finish_operation(conn, operation_id, len(done), _count_events(done))
        return done, gone

    try:
        return run_in_transaction(app.engine, lambda conn: work(conn, False))
    except DBAPIError:
        # The archive refused an event's exact form (PostgreSQL's jsonb and a NaN, say): the
        # lenient form keeps the row as JSON text, as a worker's archive does.
        return run_in_transaction(app.engine, lambda conn: work(conn, True))
