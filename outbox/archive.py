"""The archive: replaying archived events into their buffer, and pruning old archive rows.

Both name the statuses they take (:class:`outbox.schema.ArchiveStatus`); told none, replay
takes dead letters and prune the statuses that are history, never dead letters.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Column, Connection, Dialect, Float, Table

from outbox import _log, schema
from outbox._db import dialects, queries, run_in_transaction
from outbox._db.dialects import JSON_AS_TEXT_MARKER
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError, ReplayError

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


def replay(
    app: Outbox,
    *,
    handler: str | None = None,
    status: StatusFilter = None,
    group_id: uuid.UUID | None = None,
    dry_run: bool = False,
    all_statuses: bool = False,
) -> ReplayResult:
    """Put archived events back into their buffers as new events, and remove them from the archive.

    Which events: those archived with ``status`` (one status or several); every status with
    ``all_statuses=True`` or, given ``group_id`` alone, every event of that group; with
    neither, dead letters only (``REPLAY_STATUSES``): discarded events were rejected for good
    and succeeded ones delivered, and replay sends them again only when told.

    Each replayed event gets a new id and ``created_at`` (an ordered handler's keeps its id, to
    be handled before the events its key held back, and its group's keys are released); its
    own columns come from the archived payload. Runs in chunks of ``REPLAY_CHUNK`` events, one
    transaction each, so a replay interrupted half way leaves every event either archived or
    back in its buffer.
    """
    if handler is not None:
        app.get_handler(handler)
    # A group named is a choice made: all of its events, whatever their status.
    chosen = _chosen(status, all_statuses, None if group_id is not None else REPLAY_STATUSES)
    by_handler: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    groups: Counter[tuple[str, uuid.UUID | None]] = Counter()
    failures: list[str] = []
    after_id = 0
    while True:
        rows = _select(app, handler, chosen, group_id, after_id)
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
            _replay_chunk(app, readable)
        by_handler.update(row["handler"] for row in readable)
        by_status.update(row["status"] for row in readable)
        groups.update((row["handler"], row["group_id"]) for row in readable)
    result = ReplayResult(
        sum(by_handler.values()), dict(by_handler), dry_run, dict(by_status), dict(groups)
    )
    if not dry_run and result.events:
        log.info(_log.ARCHIVE_REPLAYED, events=result.events, handlers=sorted(by_handler))
    if failures:
        raise ReplayError(
            f"{result.events} events replayed; {len(failures)} could not be read and stay "
            f"archived: {'; '.join(failures[:10])}"
        )
    return result


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
) -> int:
    """Delete archive rows archived more than ``older_than`` seconds ago, ``chunk`` at a time;
    the number deleted.

    Which rows: those archived with ``status`` (one status or several); every status with
    ``all_statuses=True``; with neither, the statuses that are history (``PRUNE_STATUSES``:
    succeeded, discarded, expired), so that dead letters stay until replayed or pruned by
    name.
    """
    if older_than < 0:
        raise ValueError("older_than must be >= 0 seconds")
    chosen = _chosen(status, all_statuses, PRUNE_STATUSES)
    total = 0
    start: dt.datetime | None = None
    while True:
        pruned = _prune_chunk(app, older_than, chunk, chosen, start)
        total += pruned.deleted
        start = pruned.last_archived_at
        if pruned.deleted < chunk:
            break
    if total:
        log.info(_log.ARCHIVE_PRUNED, rows=total)
    return total


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


def _replay_chunk(app: Outbox, rows: list[Any]) -> None:
    run_in_transaction(app.engine, lambda conn: _put_back(conn, app, rows))


def _select(
    app: Outbox,
    handler: str | None,
    chosen: frozenset[str] | None,
    group_id: uuid.UUID | None,
    after: int,
) -> list[Any]:
    with app.engine.connect() as conn:
        return list(
            queries.select_archived(
                conn,
                handler=handler,
                statuses=chosen,
                group_id=group_id,
                after_id=after,
                limit=REPLAY_CHUNK,
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


def _put_back(conn: Connection, app: Outbox, rows: list[Any]) -> None:
    by_table: dict[str, tuple[Table, list[dict[str, Any]]]] = {}
    held: set[tuple[str, uuid.UUID]] = set()
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
        if app.handlers[row["handler"]].ordering_key is not None:
            # Back where it was in its key's order, ahead of the events its key held back.
            event["id"] = int(row["event_id"])
            if row["group_id"] is not None:
                held.add((row["handler"], row["group_id"]))
        by_table.setdefault(table.name, (table, []))[1].append(event)
    for table, events in by_table.values():
        queries.insert_stored_rows(conn, table, events)
    queries.delete_archived(conn, [int(row["id"]) for row in rows])
    for handler, group_id in held:
        queries.release_held_keys(conn, handler, group_id=group_id)


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
        if python_type is dt.datetime:
            return dt.datetime.fromisoformat(value)
        if python_type is dt.date:
            return dt.date.fromisoformat(value)
        if python_type is dt.time:
            return dt.time.fromisoformat(value)
        if python_type is uuid.UUID:
            return uuid.UUID(value)
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
