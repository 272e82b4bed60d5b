"""Replaying archived events: putting them back into their buffers, each under its own id (or a
new one when told), and marking their archive rows replayed by the operation that did it.

Told no status and no group, a replay takes dead letters (``REPLAY_STATUSES``).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Connection, Dialect, Table

from outbox import schema
from outbox._core import log as _log
from outbox._core.values import archived_payload, from_archived, storage_type
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import JSON_AS_TEXT_MARKER
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError, ReplayError
from outbox.handler import MAX_BATCH_SIZE
from outbox.ops import operators
from outbox.ops.archive import StatusFilter, chosen_statuses, count_up_to
from outbox.ops.operators import checked_actor
from outbox.ops.progress import Phase, Progress

log = _log.get_logger(__name__)

REPLAY_CHUNK = 500


# What `replay` takes when told no status and no group: dead letters, the events an operator
# replays once the cause is fixed. Discarded events were rejected for good, succeeded ones
# were delivered, expired ones were past their use: replaying them is a choice to name.
REPLAY_STATUSES = (schema.ArchiveStatus.DEAD,)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did (or, with ``dry_run``, would do)."""

    events: int
    by_handler: dict[str, int] = field(default_factory=dict)
    dry_run: bool = False
    by_status: dict[str, int] = field(default_factory=dict)
    """Events by the status they were archived with."""
    groups: dict[tuple[str, uuid.UUID | None], int] = field(default_factory=dict)
    """Events by (handler, group they were archived from)."""
    operation_id: int | None = None
    """The record of the replay (:func:`outbox.ops.operators.history`); None for a dry run or
    when none was replayed."""


# Every status a replay may take: a replayed event is back in its buffer already, and a
# superseded one is an older state of its key that a later event carried (sent again, it would
# reach the downstream after the newer one).
NOT_REPLAYED = frozenset({schema.ArchiveStatus.REPLAYED, schema.ArchiveStatus.SUPERSEDED})
REPLAYABLE = frozenset(s.value for s in schema.ArchiveStatus if s not in NOT_REPLAYED)


def replay(
    app: Outbox,
    *,
    handler: str | None = None,
    status: StatusFilter = None,
    group_id: uuid.UUID | None = None,
    dry_run: bool = False,
    all_statuses: bool = False,
    group_ids: Collection[uuid.UUID] | None = None,
    actor: str | None = None,
    selection: str | None = None,
    operation_id: int | None = None,
    chunk: int = REPLAY_CHUNK,
    progress: Progress | None = None,
    new_ids: bool = False,
) -> ReplayResult:
    """Put archived events back into their buffers, and mark them replayed.

    Which events: those archived with ``status`` (one status or several); every status with
    ``all_statuses=True`` or, given ``group_id`` (or ``group_ids``) alone, every event of those
    groups; with neither, dead letters only (``REPLAY_STATUSES``): discarded events were
    rejected for good and succeeded ones delivered, and replay sends them again only when told.
    An event replayed already is never taken again.

    Each replayed event keeps its id: the same event, so a sink derives the same message id
    from it and a consumer that de-duplicates by message id drops a copy it already took (an
    ordered handler's is also handled before the events its key held back, and its group's
    keys are released). It gets a new ``created_at``; its own columns come from the archived
    payload. An event whose id another row of its buffer holds now stays archived and is
    named in the :class:`~outbox.exceptions.ReplayError` raised once the rest is replayed.
    ``new_ids=True`` is the operator's choice of a new identity (a consumer takes each event
    as a new one): every event but an ordered handler's goes back under a new id. The archive
    row stays, marked ``replayed`` with the event it became and the operation that did it,
    recorded as done by ``actor`` (default: ``user@host``) with ``selection`` (JSON; default:
    the filters given), or counted into the operation ``operation_id`` when given (one replay
    made of several calls). Runs in chunks of ``chunk`` events (:data:`REPLAY_CHUNK`), one
    transaction each, which also adds them to the operation's record, so a replay interrupted
    half way leaves every event either archived or back in its buffer, and its record counting
    those put back.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the events to replay (counted up
    to :data:`~outbox.ops.progress.COUNT_CAP`) and each chunk replayed; when it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two chunks.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_BATCH_SIZE:
        raise ConfigurationError(f"chunk: expected 1 to {MAX_BATCH_SIZE} events, got {chunk!r}")
    if handler is not None:
        app.get_handler(handler)
    if group_id is not None:
        group_ids = [group_id, *(group_ids or ())]
    # A group named is a choice made: all of its events, whatever their status.
    chosen = chosen_statuses(status, all_statuses, None if group_ids else REPLAY_STATUSES)
    if chosen is not None and schema.ArchiveStatus.REPLAYED in chosen:
        raise ConfigurationError(
            "status: replayed events are back in their buffers already; they are not replayed"
        )
    if chosen is not None and schema.ArchiveStatus.SUPERSEDED in chosen:
        raise ConfigurationError(
            "status: superseded events are older states of their keys that a later event "
            "carried; replayed, they would reach the downstream after the newer one"
        )
    chosen = REPLAYABLE if chosen is None else chosen
    by_handler: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    groups: Counter[tuple[str, uuid.UUID | None]] = Counter()
    failures: list[str] = []
    reported = None if dry_run else progress
    found = None
    if reported is not None:
        found = count_up_to(app, handler=handler, statuses=chosen, group_ids=group_ids)
    phase = Phase(reported, "replayed", "events", found)
    after_id = 0
    while True:
        phase.check(operation_id)
        rows = _select(app, handler, chosen, group_ids, after_id, chunk)
        if not rows:
            break
        after_id = int(rows[-1]["id"])
        readable = []
        for row in rows:
            handler_table(app, row["handler"])
            try:
                readable.append({**row, "payload": archived_payload(row["payload"])})
            except (ValueError, RecursionError) as error:
                failures.append(f"archive row {row['id']}: {type(error).__name__}")
        if not dry_run and readable:
            if operation_id is None:
                operation_id = _record_replay(
                    app, actor, selection, handler, chosen, group_ids, all_statuses, new_ids
                )
            left = _replay_chunk(app, readable, operation_id, new_ids)
            failures += left.values()
            readable = [row for row in readable if row["id"] not in left]
        phase.advance(len(rows))
        by_handler.update(row["handler"] for row in readable)
        by_status.update(row["status"] for row in readable)
        groups.update((row["handler"], row["group_id"]) for row in readable)
    phase.end()
    result = ReplayResult(
        sum(by_handler.values()),
        dict(by_handler),
        dry_run,
        dict(by_status),
        dict(groups),
        operation_id,
    )
    if not dry_run and result.events:
        log.info(
            _log.ARCHIVE_REPLAYED,
            events=result.events,
            handlers=sorted(by_handler),
            operation=operation_id,
        )
    if failures:
        raise ReplayError(
            f"{result.events} events replayed; {len(failures)} stay archived: "
            f"{'; '.join(failures[:10])}"
            + (f"; {_TAKEN_HINT}" if any(_TAKEN in f for f in failures) else "")
        )
    return result


_TAKEN = "id taken by another row of"
_TAKEN_HINT = (
    "an event whose id is taken goes back only as a new event, which a consumer takes as "
    "new: replay it with new ids (new_ids=True, --new-ids)"
)


def _record_replay(
    app: Outbox,
    actor: str | None,
    selection: str | None,
    handler: str | None,
    chosen: frozenset[str],
    group_ids: Collection[uuid.UUID] | None,
    all_statuses: bool,
    new_ids: bool,
) -> int:
    if selection is None:
        given: dict[str, Any] = {"handlers": [handler] if handler else []}
        given["statuses"] = [] if all_statuses else sorted(chosen)
        given["group_ids"] = [str(g) for g in group_ids or ()]
        given["new_ids"] = new_ids
        selection = json.dumps({k: v for k, v in given.items() if v}, sort_keys=True)
    return operators.record(app, schema.OperationAction.REPLAY, checked_actor(actor), selection)


def _replay_chunk(app: Outbox, rows: list[Any], operation_id: int, new_ids: bool) -> dict[int, str]:
    """Replay a chunk of archive rows in one transaction; those left archived (by archive
    row id), each with why."""

    def work(conn: Connection) -> dict[int, str]:
        put, left = put_back(conn, app, rows, operation_id, new_ids=new_ids)
        done = [row for row in rows if row["id"] in put]
        groups = len({(row["handler"], row["group_id"]) for row in done})
        queries.finish_operation(conn, operation_id, groups, len(done))
        return left

    return run_in_transaction(app.engine, work)


def _select(
    app: Outbox,
    handler: str | None,
    chosen: frozenset[str] | None,
    group_ids: Collection[uuid.UUID] | None,
    after: int,
    chunk: int,
) -> list[Any]:
    with app.engine.connect() as conn:
        return list(
            queries.select_archived(
                conn,
                handler=handler,
                statuses=chosen,
                group_id=None,
                group_ids=group_ids,
                after_id=after,
                limit=chunk,
            )
        )


def handler_table(app: Outbox, name: str) -> Table:
    """The buffer of handler ``name``, which archived events go back into; a ReplayError when
    this application has no such handler."""
    if name not in app.handlers:
        known = ", ".join(sorted(app.handlers)) or "none"
        raise ReplayError(
            f"archived events of handler {name!r} cannot be replayed: this application has no "
            f"such handler (it has: {known}); filter with --handler"
        )
    if app.handlers[name].flags is not None:
        raise ReplayError(
            f"archived events of handler {name!r} are keys of flagged rows of its business "
            f"table, not events: release its held keys (outbox held release --handler {name}) "
            "to have those rows handled again, in their current state; filter with --handler"
        )
    return app.handlers[name].table


def put_back(
    conn: Connection,
    app: Outbox,
    rows: list[Any],
    operation_id: int,
    *,
    edited: Mapping[str, Any] | None = None,
    release_keys: bool = True,
    new_ids: bool = False,
) -> tuple[dict[int, int], dict[int, str]]:
    """Insert archived events back into their buffers and mark their rows replayed by
    ``operation_id``: the events' ids in their buffers, and the rows left archived with why,
    both by archive row id. ``edited``: stored values that replace the archived ones.

    Each event keeps its own id, the identity sinks derive message ids from, unless
    ``new_ids`` (then only an ordered handler's does: its place in its key's order). An id
    another row of the buffer holds now (a row written with explicit ids, a SQLite buffer
    made without ``AUTOINCREMENT``, an earlier copy in the same rows) is not taken over: that
    row is left archived.
    """
    built = []
    for row in rows:
        table = handler_table(app, row["handler"])
        own = (c for c in table.columns if c.name not in BufferMixin.OWN_COLUMNS)
        event = stored_values(own, row["payload"], conn.dialect)
        event.update(edited or {})
        ordered = app.handlers[row["handler"]].ordering_key is not None
        built.append((row, table, event, ordered, ordered or not new_ids))
    kept: dict[str, tuple[Table, set[int]]] = {}
    for row, table, _, _, keep in built:
        if keep:
            kept.setdefault(table.name, (table, set()))[1].add(int(row["event_id"]))
    taken = {name: queries.existing_ids(conn, table, ids) for name, (table, ids) in kept.items()}
    by_table: dict[str, tuple[Table, list[int], list[dict[str, Any]]]] = {}
    held: set[tuple[str, uuid.UUID]] = set()
    left: dict[int, str] = {}
    stays: set[tuple[str, uuid.UUID]] = set()
    for row, table, event, ordered, keep in built:
        if keep:
            event_id = int(row["event_id"])
            if event_id in taken[table.name]:
                left[int(row["id"])] = f"event {event_id}: {_TAKEN} {table.name}"
                stays.add((row["handler"], row["group_id"]))
                continue
            taken[table.name].add(event_id)
            event["id"] = event_id
            if ordered and row["group_id"] is not None and release_keys:
                held.add((row["handler"], row["group_id"]))
        entry = by_table.setdefault(table.name, (table, [], []))
        entry[1].append(int(row["id"]))
        entry[2].append(event)
    put: dict[int, int] = {}
    for table, archive_ids, events in by_table.values():
        new = queries.insert_stored_rows(conn, table, events)
        put.update(zip(archive_ids, new, strict=True))
    queries.mark_archived(
        conn,
        list(put),
        status=schema.ArchiveStatus.REPLAYED.value,
        operation_id=operation_id,
        replay_event_ids=put,
    )
    # A group with an event left archived keeps holding its keys, as a dead group does: one
    # named in this chunk, or a dead letter of it a later chunk puts back (the key's newer
    # events must not pass the group's events still on their way back).
    for handler, group_id in held - stays:
        dead = queries.count_archived(
            conn, handler=handler, group_id=group_id, statuses=[schema.ArchiveStatus.DEAD]
        )
        if not dead:
            queries.release_held_keys(conn, handler, group_id=group_id)
    return put, left


def stored_values(
    columns: Iterable[Column[Any]], payload: Mapping[str, Any], dialect: Dialect
) -> dict[str, Any]:
    """An archived event's values (its payload, read: :func:`outbox._core.values.archived_payload`)
    as ``columns`` store them on ``dialect``, by column name, for an insert of stored rows
    (:func:`outbox._db.queries.insert_stored_rows`): the columns the payload has (one archived
    before a column was added lacks it), in its own form (SQLite's lenient one keeps JSON
    columns as their text, :data:`~outbox._db.dialects.JSON_AS_TEXT_MARKER`). A
    :class:`~outbox.exceptions.ReplayError` names a column whose value cannot be stored."""
    json_as_text = bool(payload.get(JSON_AS_TEXT_MARKER, False))
    return {
        column.name: _stored(column, payload[column.name], dialect, json_as_text=json_as_text)
        for column in columns
        if column.name in payload
    }


def _stored(column: Column[Any], value: Any, dialect: Dialect, *, json_as_text: bool) -> Any:
    """An archived value as ``column`` stores it (:func:`outbox._core.values.from_archived`);
    a :class:`~outbox.exceptions.ReplayError` naming the column when it cannot be."""
    try:
        return from_archived(column, value, dialect, json_as_text=json_as_text)
    except (TypeError, ValueError) as error:
        stored = storage_type(column.type, dialect).python_type
        raise ReplayError(
            f"cannot turn archived value of column {column.name!r} back into "
            f"{stored.__name__}: {error}"
        ) from error
