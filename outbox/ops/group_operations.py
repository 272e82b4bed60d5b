"""The operator's writes on groups: running waiting groups now (:func:`retry`), replaying dead
ones (:func:`replay`, :func:`replay_group`) and giving groups up (:func:`discard`), each taking
the groups a :class:`~outbox.ops.selection.Selection` matches a page at a time and recorded as
one operation (:mod:`outbox.ops.operators`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops import operators
from outbox.ops.groups import MAX_LIMIT, Group, Listing, find, show
from outbox.ops.operators import checked_actor
from outbox.ops.progress import Phase, Progress
from outbox.ops.replay import REPLAY_CHUNK
from outbox.ops.replay import replay as replay_archived
from outbox.ops.selection import Selection, checked_text
from outbox.schema import GroupStatus

__all__ = [
    "DISCARD_PAGE",
    "REPLAY_PAGE",
    "RETRIED",
    "RETRY_PAGE",
    "OperationResult",
    "discard",
    "replay",
    "replay_group",
    "retry",
]

log = _log.get_logger(__name__)

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
    """The record of it (:func:`outbox.ops.operators.history`); None for a dry run."""


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

    A group in flight is left alone (a worker holds it), and so is a flag handler's (its rows
    stay flagged, and would be taken again): each is named in ``skipped``, with why. The
    selection must narrow something: an empty one is refused. Recorded as an operation by
    ``actor`` (default: :func:`outbox.ops.operators.default_actor`), with ``reason``.

    Groups are discarded ``page_size`` (:data:`DISCARD_PAGE`) per transaction, which also adds
    them to the operation's record. ``progress`` (:class:`~outbox.ops.progress.Progress`) is told
    the groups to discard (counted up to :data:`COUNT_CAP`) and each page discarded; when it
    asks to stop, :class:`~outbox.ops.progress.StoppedError` is raised between two pages.
    """
    _narrowing(selection, "discard")
    checked_text(reason, "reason")
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
        chosen = [g for g in page if g.status not in _NOT_DISCARDED and not _flagged(app, g)]
        skipped += [(g, _why_not_discarded(g)) for g in page if g not in chosen]
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
    :func:`outbox.ops.replay.replay` does, recorded as one operation by ``actor``. Groups of
    other statuses it matches are not dead: they are named in ``skipped``. The selection must
    narrow something: an empty one is refused.

    Groups are replayed ``page_size`` (:data:`REPLAY_PAGE`) at a time, their events ``chunk``
    per transaction (:data:`outbox.ops.REPLAY_CHUNK` unless given). ``progress``
    (:class:`~outbox.ops.progress.Progress`) is told the groups to replay (counted up to
    :data:`COUNT_CAP`) and each page replayed; when it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two pages, every group before
    wholly replayed and recorded."""
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
            done = replay_archived(
                app,
                group_ids=[g.group_id for g in page],
                status=schema.ArchiveStatus.DEAD,
                operation_id=operation_id,
                chunk=REPLAY_CHUNK if chunk is None else chunk,
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
    group = show(app, group_id).group
    if group.status in queries.ARCHIVED:
        return replay(app, Selection(group_ids=(group_id,)), actor=actor, dry_run=dry_run)
    if group.status != schema.ArchiveStatus.DISCARDED:
        why = f"{group.status}: not dead or discarded"
        return OperationResult(_REPLAY, [], 0, [(group, why)], dry_run)
    done = replay_archived(
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


def _flagged(app: Outbox, group: Group) -> bool:
    handler = app.handlers.get(group.handler)
    return handler is not None and handler.flags is not None


def _why_not_discarded(group: Group) -> str:
    if group.status in _NOT_DISCARDED:
        return "in flight: a worker holds it"
    # Its rows stay flagged in the business table: discarded, they would be taken again.
    return (
        "its rows are flagged rows of a business table, taken again while flagged: release it "
        f"(outbox held release --handler {group.handler}) or clear their flags"
    )


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
