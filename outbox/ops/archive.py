"""The archive: replaying archived events into their buffer, and pruning old archive rows.

Both name the statuses they take (:class:`outbox.schema.ArchiveStatus`); told none, replay
takes dead letters and prune the statuses that are history, never dead letters.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import functools
import json
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Column, Connection, Dialect, Float, Table, TypeDecorator
from sqlalchemy.exc import DataError

from outbox import schema
from outbox._core import log as _log
from outbox._core.checks import json_problem, text_problem
from outbox._db import dialects, queries, run_in_transaction
from outbox._db.dialects import JSON_AS_TEXT_MARKER
from outbox.app import MAX_BATCH_SIZE, Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError, GroupNotFoundError, ReplayError
from outbox.ops import operators
from outbox.ops.operators import checked_actor
from outbox.ops.progress import COUNT_CAP, Phase, Progress, capped

log = _log.get_logger(__name__)

REPLAY_CHUNK = 500
PRUNE_CHUNK = 1000


# What `replay` takes when told no status and no group: dead letters, the events an operator
# replays once the cause is fixed. Discarded events were rejected for good, succeeded ones
# were delivered, expired ones were past their use: replaying them is a choice to name.
REPLAY_STATUSES = (schema.ArchiveStatus.DEAD,)
# What `prune` deletes when told no status: the statuses that are history. Dead letters stay
# until someone replays them or prunes them by name.
PRUNE_STATUSES = (
    schema.ArchiveStatus.SUCCEEDED,
    schema.ArchiveStatus.DISCARDED,
    schema.ArchiveStatus.EXPIRED,
    schema.ArchiveStatus.REPLAYED,
)

StatusFilter = str | Iterable[str] | None
"""One archive status, several, or ``None``; spelled as :class:`outbox.schema.ArchiveStatus`
spells them (``"dead"``), in any case."""


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
    """The record of the replay (:func:`history`); None for a dry run or when none was
    replayed."""


@dataclass(frozen=True, slots=True)
class EditResult:
    """What a replay with edit did: the dead (or discarded) event it took and the event it
    became."""

    handler: str
    group_id: uuid.UUID
    event_id: int
    """The archived event's id."""
    new_event_id: int
    """The id of the event put back into the buffer: its own (``event_id``), as every replay
    keeps it."""
    changed: tuple[str, ...]
    """The columns changed."""
    operation_id: int


@dataclass(frozen=True, slots=True)
class ArchivedEvent:
    """An event in the archive: why it is there, and what became of it."""

    id: int
    """The archive row's id."""
    handler: str
    event_id: int
    group_id: uuid.UUID | None
    status: schema.ArchiveStatus
    attempts: int
    error: str | None
    values: dict[str, Any]
    """Its columns as archived (``{}`` when hidden or unreadable)."""
    archived_at: dt.datetime
    operation_id: int | None
    """The operation that replayed or discarded it (:func:`history`)."""
    replay_event_id: int | None
    """The event a replay made of it, in its buffer."""


@dataclass(frozen=True, slots=True)
class ArchivePage:
    """A page of the archive, newest first."""

    events: list[ArchivedEvent]
    next: int | None
    """The ``before`` of the next page; None on the last."""
    searched: int | None
    """With a payload search: how many of the newest rows it looked among."""


@dataclass(frozen=True, slots=True)
class Operation:
    """An operator's replay, edit or discard, as recorded: who, when, which filter, how many."""

    id: int
    action: schema.OperationAction
    actor: str
    selection: dict[str, Any]
    """The filter it was given."""
    groups: int
    events: int
    detail: str | None
    done_at: dt.datetime


def statuses(status: StatusFilter, *, argument: str = "status") -> frozenset[str] | None:
    """``status`` as a set of :class:`~outbox.schema.ArchiveStatus` values (``None`` stays
    ``None``); a :class:`~outbox.exceptions.ConfigurationError` naming ``argument`` and the
    accepted values for any other word."""
    if status is None:
        return None
    given = [status] if isinstance(status, str) else list(status)
    known = {s.value: s for s in schema.ArchiveStatus}
    found = set()
    for word in given:
        value = known.get(str(word).strip().lower())
        if value is None:
            raise ConfigurationError(
                f"{argument}: {word!r} is not an archive status; expected one of {', '.join(known)}"
            )
        found.add(value.value)
    if not found:
        raise ConfigurationError(f"{argument}: no status given; expected one of {', '.join(known)}")
    return frozenset(found)


def _chosen(
    status: StatusFilter, all_statuses: bool, default: Iterable[str] | None
) -> frozenset[str] | None:
    if status is not None and all_statuses:
        raise ConfigurationError("status and all_statuses=True: give one or the other")
    if all_statuses:
        return None
    chosen = statuses(status)
    if chosen is None and default is not None:
        return frozenset(default)
    return chosen


def counts(
    app: Outbox,
    *,
    handler: str | None = None,
    status: StatusFilter = None,
    group_id: uuid.UUID | None = None,
    older_than: float | None = None,
) -> dict[tuple[str, str], int]:
    """Archived events by (handler, status), of every status unless ``status`` names some:
    what a replay or a prune with the same filters would take. ``older_than``: only rows
    archived more than that many seconds ago."""
    chosen = statuses(status)
    with app.engine.connect() as conn:
        return queries.count_archived(
            conn,
            handler=handler,
            statuses=chosen,
            group_id=group_id,
            older_than_seconds=older_than,
        )


# The statuses an edit takes: events that were never delivered, dead or refused for good (a
# poison value a downstream rejected per record is archived as discarded).
EDITABLE = (schema.ArchiveStatus.DEAD.value, schema.ArchiveStatus.DISCARDED.value)
# Every status a replay may take: a replayed event is back in its buffer already.
REPLAYABLE = frozenset(s.value for s in schema.ArchiveStatus if s != schema.ArchiveStatus.REPLAYED)


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
    chosen = _chosen(status, all_statuses, None if group_ids else REPLAY_STATUSES)
    if chosen is not None and schema.ArchiveStatus.REPLAYED in chosen:
        raise ConfigurationError(
            "status: replayed events are back in their buffers already; they are not replayed"
        )
    chosen = REPLAYABLE if chosen is None else chosen
    by_handler: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    groups: Counter[tuple[str, uuid.UUID | None]] = Counter()
    failures: list[str] = []
    reported = None if dry_run else progress
    found = None
    if reported is not None:
        found = _count_up_to(app, handler=handler, statuses=chosen, group_ids=group_ids)
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
            _handler_of(app, row["handler"])
            try:
                readable.append({**row, "payload": parse_payload(row["payload"])})
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


PAYLOAD_SCAN = 100_000
"""Archive rows a payload search looks among, the newest first: a bounded read however large
the archive."""


def browse(
    app: Outbox,
    *,
    status: StatusFilter = None,
    handler: str | None = None,
    group_id: uuid.UUID | None = None,
    payload: str | None = None,
    limit: int = 50,
    before: int | None = None,
) -> ArchivePage:
    """The archive's events, newest first: of ``status`` (one or several; every status
    without), of one handler or group, holding ``payload`` text (any case, among the newest
    :data:`PAYLOAD_SCAN` rows), ``limit`` of them before the row ``before`` (a page's
    ``next``)."""
    chosen = statuses(status)
    if handler is not None:
        app.get_handler(handler)
    if group_id is not None and not isinstance(group_id, uuid.UUID):
        raise ConfigurationError(f"group_id: expected a UUID, got {type(group_id).__name__}")
    if payload is not None and (not isinstance(payload, str) or not payload.strip()):
        raise ConfigurationError(f"payload: expected some text, got {payload!r}")
    if payload is not None and text_problem(payload) is not None:
        raise ConfigurationError(f"payload: {text_problem(payload)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigurationError(f"limit: expected 1 to 1000 events, got {limit!r}")
    if before is not None and (
        isinstance(before, bool) or not isinstance(before, int) or not 0 <= before < 2**63
    ):
        raise ConfigurationError(f"before: expected an archive row's id, got {before!r}")
    with app.engine.connect() as conn:
        rows = queries.browse_archived(
            conn,
            handler=handler,
            statuses=chosen,
            group_id=group_id,
            payload=payload,
            before_id=before,
            limit=limit + 1,
            scan=PAYLOAD_SCAN,
        )
    more = len(rows) > limit
    rows = rows[:limit]
    events = [
        ArchivedEvent(
            id=int(r["id"]),
            handler=r["handler"],
            event_id=int(r["event_id"]),
            group_id=r["group_id"],
            status=schema.ArchiveStatus(r["status"]),
            attempts=int(r["attempts"]),
            error=r["error"],
            values=_readable(r["payload"]),
            archived_at=r["archived_at"],
            operation_id=r["operation_id"],
            replay_event_id=r["replay_event_id"],
        )
        for r in rows
    ]
    next_before = events[-1].id if more and events else None
    return ArchivePage(events, next_before, None if payload is None else PAYLOAD_SCAN)


def _readable(payload: str | None) -> dict[str, Any]:
    try:
        values = parse_payload(payload)
    except (ValueError, RecursionError) as error:
        return {"(unreadable payload)": f"{type(error).__name__}: {error}"}
    values.pop(JSON_AS_TEXT_MARKER, None)
    return values


def history(
    app: Outbox, *, action: str | None = None, limit: int = 50, before_id: int | None = None
) -> list[Operation]:
    """The replays, edits and discards operators made, newest first: ``limit`` of them, of one
    ``action`` (:class:`~outbox.schema.OperationAction`) or all, before the operation
    ``before_id`` (the next page)."""
    if action is not None:
        known = {a.value for a in schema.OperationAction}
        if action not in known:
            raise ConfigurationError(
                f"action: {action!r} is not an operation; expected one of {', '.join(known)}"
            )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ConfigurationError(f"limit: expected 1 to 1000 operations, got {limit!r}")
    if before_id is not None and (
        isinstance(before_id, bool) or not isinstance(before_id, int) or not 0 <= before_id < 2**63
    ):
        raise ConfigurationError(f"before_id: expected an operation's id, got {before_id!r}")
    with app.engine.connect() as conn:
        rows = queries.operations(conn, action=action, limit=limit, before_id=before_id)
    return [
        Operation(
            r.id,
            schema.OperationAction(r.action),
            r.actor,
            json.loads(r.selection) if r.selection else {},
            r.groups,
            r.events,
            r.detail,
            r.done_at,
        )
        for r in rows
    ]


def edit(
    app: Outbox,
    group_id: uuid.UUID,
    event_id: int,
    changes: Mapping[str, Any],
    *,
    actor: str | None = None,
) -> EditResult:
    """Replay one dead or discarded event with some of its values changed: the buffer
    model's columns named in ``changes`` take the new values, the others keep the archived
    ones, and the event goes back into its buffer under its own id (the same event for sinks
    and consumers, fixed; an id another row holds now is a
    :class:`~outbox.exceptions.ReplayError`, and nothing is written). Its archive row stays,
    marked ``replayed`` and pointing at the event; the operation is
    recorded as an edit by ``actor`` with the columns changed (not their values, which may be
    personal data).

    A value may be given as the column's Python type or as text, parsed for the column's type
    (``true``/``false``, numbers, ISO times, UUIDs, JSON for a JSON column, hex for bytes).
    Each name must be a column of the buffer other than outbox's own (``id``, ``group_id``,
    ``created_at``), and each value must be what the column takes: anything else is a
    :class:`~outbox.exceptions.ConfigurationError` naming it, and nothing is written.

    An ordered handler's dead group keeps holding its keys while other events of it are dead:
    the edited event is handled once they are replayed or discarded too.
    """
    if not isinstance(group_id, uuid.UUID):
        raise ConfigurationError(f"group_id: expected a UUID, got {type(group_id).__name__}")
    if isinstance(event_id, bool) or not isinstance(event_id, int):
        raise ConfigurationError(f"event_id: expected an integer, got {type(event_id).__name__}")
    if not isinstance(changes, Mapping) or not changes:
        raise ConfigurationError("changes: expected a mapping of column names to new values")
    with app.engine.connect() as conn:
        rows = queries.select_archived(
            conn,
            handler=None,
            statuses=EDITABLE,
            group_id=group_id,
            after_id=0,
            limit=MAX_BATCH_SIZE,
        )
    row = next((r for r in rows if int(r["event_id"]) == event_id), None)
    if row is None and not rows and not _archived_at_all(app, group_id):
        raise GroupNotFoundError(group_id)
    if row is None:
        raise ConfigurationError(
            f"no dead or discarded event {event_id} in group {group_id}: `outbox show "
            f"{group_id}` lists its events"
        )
    table = _handler_of(app, row["handler"])
    payload = parse_payload(row["payload"])
    edited = _edited_values(table, changes, app.engine.dialect)
    actor = checked_actor(actor)
    changed = tuple(sorted(edited))
    detail = f"event {event_id} of group {group_id}: {', '.join(changed)} changed"

    def work(conn: Connection) -> tuple[int, int]:
        operation_id = queries.record_operation(
            conn,
            action=schema.OperationAction.EDIT.value,
            actor=actor,
            selection=json.dumps({"group_ids": [str(group_id)], "event_id": event_id}),
            groups=1,
            events=1,
            detail=detail,
        )
        # An ordered handler's group holds its keys while any event of it is dead.
        dead = schema.ArchiveStatus.DEAD
        remaining = sum(1 for r in rows if r["id"] != row["id"] and r["status"] == dead)
        put, left = _put_back(
            conn,
            app,
            [{**row, "payload": payload}],
            operation_id,
            edited=edited,
            release_keys=remaining == 0,
        )
        if left:
            raise ReplayError(f"{left[int(row['id'])]} (group {group_id}); nothing written")
        return operation_id, put[int(row["id"])]

    try:
        operation_id, new_id = run_in_transaction(app.engine, work)
    except DataError as error:
        # A value of the column's type that the column cannot hold (too long, out of range):
        # refused as a value of the wrong type is, and nothing written.
        raise ConfigurationError(
            f"{', '.join(changed)}: the database refused the new value "
            f"({dialects.error_summary(error)})"
        ) from error
    log.info(
        _log.ARCHIVE_EDITED,
        handler=row["handler"],
        group=str(group_id),
        event_id=event_id,
        new_event_id=new_id,
        columns=list(changed),
        actor=actor,
        operation=operation_id,
    )
    return EditResult(row["handler"], group_id, event_id, new_id, changed, operation_id)


def _archived_at_all(app: Outbox, group_id: uuid.UUID) -> bool:
    with app.engine.connect() as conn:
        return bool(queries.archived_of_group(conn, group_id))


def _edited_values(table: Table, changes: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """The stored values of the changed columns, each checked against its column."""
    columns = {column.name: column for column in table.columns}
    values = {}
    for name, value in changes.items():
        column = columns.get(name) if isinstance(name, str) else None
        if column is None or name in BufferMixin.OWN_COLUMNS:
            mine = sorted(n for n in columns if n not in BufferMixin.OWN_COLUMNS)
            why = "is outbox's own column" if column is not None else "is not a column"
            raise ConfigurationError(
                f"{name!r} {why} of buffer {table.name}; its columns: {', '.join(mine)}"
            )
        values[name] = _edited_value(column, value, dialect)
    return values


def _edited_value(column: Column[Any], value: Any, dialect: Dialect) -> Any:
    """A value an operator gave for ``column``, as the database stores it."""
    if value is None:
        if not column.nullable:
            raise ConfigurationError(f"{column.name}: NULL is not allowed (the column is NOT NULL)")
        return None
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        python_type = object
    if isinstance(value, str) and python_type is not str:
        value = _parsed_text(column, python_type, value, dialect)
    widened = (python_type is float and isinstance(value, int | decimal.Decimal)) or (
        python_type is decimal.Decimal and isinstance(value, int | float)
    )
    if python_type is not object and not isinstance(value, python_type) and not widened:
        raise ConfigurationError(
            f"{column.name}: expected {python_type.__name__}, got {type(value).__name__}"
        )
    problem = json_problem(value, column.name) if isinstance(value, str | dict | list) else None
    if problem is not None:
        raise ConfigurationError(problem)
    if isinstance(column.type, TypeDecorator):
        try:
            value = column.type.process_bind_param(value, dialect)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"{column.name}: {error}") from error
    return value


def _parsed_text(column: Column[Any], python_type: type, text: str, dialect: Dialect) -> Any:
    try:
        if isinstance(dialects.storage_type(column.type, dialect), JSON) or python_type in (
            dict,
            list,
        ):
            return json.loads(text)
        if python_type is bool:
            word = text.strip().lower()
            if word not in ("true", "false", "1", "0"):
                raise ValueError(f"expected true or false, got {text!r}")
            return word in ("true", "1")
        if python_type in _FROM_TEXT:
            return _FROM_TEXT[python_type](text)
        if python_type is decimal.Decimal:
            return decimal.Decimal(text)
        if python_type is bytes:
            return bytes.fromhex(text)
        if python_type in (int, float):
            return python_type(text)
    except (ValueError, TypeError, decimal.InvalidOperation) as error:
        raise ConfigurationError(
            f"{column.name}: {text!r} is not a valid {python_type.__name__}: {error}"
        ) from error
    return text


def parse_payload(text: str | None) -> dict[str, Any]:
    """An archived payload, with exact decimals and integers of any size.

    A payload archived in the lenient form (PostgreSQL: the row as JSON text) is a JSON
    string holding the row's JSON: it is parsed twice.
    """
    if text is None:
        raise ValueError("empty payload")
    payload = json.loads(text, parse_float=decimal.Decimal, parse_int=_integer)
    if isinstance(payload, str):
        payload = json.loads(payload, parse_float=decimal.Decimal, parse_int=_integer)
    if not isinstance(payload, dict):
        raise ValueError("payload is not a JSON object")
    return payload


def _integer(text: str) -> int | decimal.Decimal:
    # Python refuses to parse integers of more than 4,300 digits; Decimal has no such limit.
    return int(text) if len(text) < 4000 else decimal.Decimal(text)


def prune(
    app: Outbox,
    *,
    older_than: float,
    chunk: int = PRUNE_CHUNK,
    status: StatusFilter = None,
    all_statuses: bool = False,
    progress: Progress | None = None,
) -> int:
    """Delete archive rows archived more than ``older_than`` seconds ago, ``chunk`` at a time;
    the number deleted.

    Which rows: those archived with ``status`` (one status or several); every status with
    ``all_statuses=True``; with neither, the statuses that are history (``PRUNE_STATUSES``:
    succeeded, discarded, expired, replayed), so that dead letters stay until replayed or
    pruned by name. The attempts recorded of groups that are gone (no job, no dead event) and
    the ingest's idempotency keys and the per-minute throughput older than ``older_than`` go
    too (a producer retrying later than that writes its event again); the record of
    operators' operations stays.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the archive rows to delete
    (counted up to :data:`~outbox.ops.progress.COUNT_CAP`) and each chunk deleted; when it asks to
    stop, :class:`~outbox.ops.progress.StoppedError` is raised between two chunks.
    """
    if older_than < 0:
        raise ValueError("older_than must be >= 0 seconds")
    chosen = _chosen(status, all_statuses, PRUNE_STATUSES)
    found = None
    if progress is not None:
        found = _count_up_to(app, statuses=chosen, older_than_seconds=older_than)
    phase = Phase(progress, "pruned", "archive rows", found)
    total = 0
    start: dt.datetime | None = None
    while True:
        phase.check()
        pruned = _prune_chunk(app, older_than, chunk, chosen, start)
        total += pruned.deleted
        phase.advance(pruned.deleted)
        start = pruned.last_archived_at
        if pruned.deleted < chunk:
            break
    phase.end()
    for delete_old in (
        queries.delete_old_attempts,
        queries.delete_old_ingest_keys,
        queries.delete_old_throughput,
    ):
        while True:
            phase.check()
            deleted = run_in_transaction(
                app.engine,
                functools.partial(delete_old, older_than_seconds=older_than, limit=chunk),
            )
            if deleted < chunk:
                break
    if total:
        log.info(_log.ARCHIVE_PRUNED, rows=total)
    return total


def _count_up_to(app: Outbox, **filters: Any) -> int | None:
    """The archive rows the filters match, for a progress report: None past the cap."""
    with app.engine.connect() as conn:
        return capped(queries.count_archived_up_to(conn, COUNT_CAP, **filters))


def _prune_chunk(
    app: Outbox,
    older_than: float,
    chunk: int,
    chosen: frozenset[str] | None,
    start: dt.datetime | None,
) -> queries.PrunedChunk:
    return run_in_transaction(
        app.engine,
        lambda conn: queries.delete_old_archived(conn, older_than, chunk, chosen, start),
    )


def _replay_chunk(app: Outbox, rows: list[Any], operation_id: int, new_ids: bool) -> dict[int, str]:
    """Replay a chunk of archive rows in one transaction; those left archived (by archive
    row id), each with why."""

    def work(conn: Connection) -> dict[int, str]:
        put, left = _put_back(conn, app, rows, operation_id, new_ids=new_ids)
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


def _handler_of(app: Outbox, name: str) -> Table:
    if name not in app.handlers:
        known = ", ".join(sorted(app.handlers)) or "none"
        raise ReplayError(
            f"archived events of handler {name!r} cannot be replayed: this application has no "
            f"such handler (it has: {known}); filter with --handler"
        )
    return app.handlers[name].table


def _put_back(
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
        table = _handler_of(app, row["handler"])
        payload = dict(row["payload"])
        json_as_text = bool(payload.pop(JSON_AS_TEXT_MARKER, False))
        event = {
            column.name: _coerce(
                column, payload[column.name], conn.dialect, json_as_text=json_as_text
            )
            for column in table.columns
            if column.name not in BufferMixin.OWN_COLUMNS and column.name in payload
        }
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
    # A group with an event left archived keeps holding its keys, as a dead group does.
    for handler, group_id in held - stays:
        queries.release_held_keys(conn, handler, group_id=group_id)
    return put, left


def _coerce(
    column: Column[Any], value: Any, dialect: Dialect, *, json_as_text: bool = False
) -> Any:
    """Turn a JSON value back into the value the column stores on ``dialect``: the archive holds
    stored values, past any TypeDecorator (a PickleType's pickled bytes)."""
    if value is None:
        return None
    stored = dialects.storage_type(column.type, dialect)
    try:
        python_type = stored.python_type
    except NotImplementedError:
        return value
    if isinstance(stored, JSON):
        if json_as_text and isinstance(value, str):
            value = json.loads(value, parse_float=decimal.Decimal, parse_int=_integer)
        return _plain_numbers(value)
    if isinstance(value, python_type) and not isinstance(stored, Float):
        return value
    try:
        if isinstance(stored, Float):
            # A double, whichever Python type the column reads it as (``asdecimal``): bound as
            # a float, exactly; MariaDB would take a Decimal of a large exponent for a DECIMAL
            # it cannot hold.
            return float(value)
        if python_type in _FROM_TEXT:
            return _FROM_TEXT[python_type](value)
        if python_type is decimal.Decimal:
            return decimal.Decimal(str(value))
        if python_type is bytes:
            return _bytes(value)
        if python_type in (int, float, str, bool):
            return python_type(value)
    except (TypeError, ValueError, binascii.Error) as error:
        raise ReplayError(
            f"cannot turn archived value of column {column.name!r} back into "
            f"{python_type.__name__}: {error}"
        ) from error
    return value


# The types JSON carries as text (ISO 8601 times, UUIDs), and how each is read back: by a
# replay from the archive's payloads, and by an edit from an operator's text.
_FROM_TEXT: dict[type, Any] = {
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    uuid.UUID: uuid.UUID,
}


def _plain_numbers(value: Any) -> Any:
    """Decimals inside a JSON value back to int or float: what its column serializes."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in value.items()}
    return value


def _bytes(value: str) -> bytes:
    # PostgreSQL's to_jsonb writes bytea as "\\x<hex>"; others may give base64.
    if value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return base64.b64decode(value)
