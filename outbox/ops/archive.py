"""The archive: which events it holds (:func:`counts`, :func:`browse`), and pruning old rows
(:func:`prune`).

Each names the statuses it takes (:class:`outbox.schema.ArchiveStatus`); told none, prune takes
the statuses that are history, never dead letters. Replaying archived events is
:mod:`outbox.ops.replay`, editing one :mod:`outbox.ops.edit`.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError

from outbox import inbox, schema
from outbox._core import log as _log
from outbox._core.checks import text_problem
from outbox._core.values import archived_payload, archived_values
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import JSON_AS_TEXT_MARKER, is_lock_timeout
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops.progress import COUNT_CAP, Phase, Progress, capped

log = _log.get_logger(__name__)

PRUNE_CHUNK = 1000
DAY_LOCK_WAIT = 1.0
"""Seconds a prune waits for the lock of a day it takes out whole (partitioned archive)."""


# What `prune` deletes when told no status: the statuses that are history. Dead letters stay
# until someone replays them or prunes them by name.
PRUNE_STATUSES = (
    schema.ArchiveStatus.SUCCEEDED,
    schema.ArchiveStatus.DISCARDED,
    schema.ArchiveStatus.EXPIRED,
    schema.ArchiveStatus.REPLAYED,
    schema.ArchiveStatus.SUPERSEDED,
)

StatusFilter = str | Iterable[str] | None
"""One archive status, several, or ``None``; spelled as :class:`outbox.schema.ArchiveStatus`
spells them (``"dead"``), in any case."""


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
    """The operation that replayed or discarded it (:func:`outbox.ops.operators.history`)."""
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


def chosen_statuses(
    status: StatusFilter, all_statuses: bool, default: Iterable[str] | None
) -> frozenset[str] | None:
    """The statuses a replay or a prune takes: ``status`` (:func:`statuses`), every status
    (None) with ``all_statuses``, ``default`` when told neither; a ConfigurationError for
    both."""
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
            values=readable_values(app, r["handler"], r["payload"]),
            archived_at=r["archived_at"],
            operation_id=r["operation_id"],
            replay_event_id=r["replay_event_id"],
        )
        for r in rows
    ]
    next_before = events[-1].id if more and events else None
    return ArchivePage(events, next_before, None if payload is None else PAYLOAD_SCAN)


@dataclass(frozen=True, slots=True)
class ArchivePart:
    """A partition of an archive partitioned by day (PostgreSQL from migration 0009, MariaDB
    from 0010)."""

    name: str
    day: dt.date | None
    """The UTC day it holds; None: the rows archived before the migration (``before``), or
    the rows of days with no partition (``default``)."""
    rows: int
    """Rows, as the database estimates them (after ANALYZE)."""
    dead_rows: int | None
    """Of which dead letters, estimated (PostgreSQL's days); None where not known."""
    bytes: int
    """Its size, indexes included."""


def parts(app: Outbox) -> list[ArchivePart]:
    """The archive's partitions, oldest first, from the catalogue (no row read); empty where
    the archive is one table (SQLite, or tables made by ``outbox schema sql``)."""
    with app.engine.connect() as conn:
        found = queries.archive_partitions(conn)
    return [
        ArchivePart(p.name, p.day, p.rows, None if p.dead_rows < 0 else p.dead_rows, p.bytes)
        for p in found
    ]


def readable_values(app: Outbox, handler: str, payload: str | None) -> dict[str, Any]:
    """An archived event's values as they are shown (the API, ``--json``, the pages): as the
    handler's columns store them, so that they are written in the encodings a live event's are
    (:mod:`outbox._core.values`: binary in base64, not as the archive's hex); the values of a
    handler the application no longer has as archived; a payload that cannot be read as a
    note saying why."""
    try:
        values = archived_payload(payload)
    except (ValueError, RecursionError) as error:
        return {"(unreadable payload)": f"{type(error).__name__}: {error}"}
    json_as_text = bool(values.pop(JSON_AS_TEXT_MARKER, False))
    known = app.handlers.get(handler)
    if known is None:
        return values
    return archived_values(
        known.table.columns, values, app.engine.dialect, json_as_text=json_as_text
    )


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
    too (a producer retrying later than that writes its event again), and every inbox's ids
    past their horizon; the record of operators' operations stays.

    Where the archive is partitioned by day (PostgreSQL from migration 0009, MariaDB from 0010),
    the statuses that are history go a whole day at a time for the days archived wholly
    before the age (a drop or a truncate: no row deleted one by one, nothing left to vacuum;
    the day's dead letters stay); the rest row by row.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the archive rows to delete
    (counted up to :data:`~outbox.ops.progress.COUNT_CAP`) and each chunk deleted; when it asks to
    stop, :class:`~outbox.ops.progress.StoppedError` is raised between two chunks.
    """
    if older_than < 0:
        raise ValueError("older_than must be >= 0 seconds")
    chosen = chosen_statuses(status, all_statuses, PRUNE_STATUSES)
    found = None
    if progress is not None:
        found = count_up_to(app, statuses=chosen, older_than_seconds=older_than)
    phase = Phase(progress, "pruned", "archive rows", found)
    total = 0
    if chosen == frozenset(PRUNE_STATUSES):
        total = _retire_days(app, older_than, phase)
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
    phase.check()
    inbox.prune(app.engine)
    if total:
        log.info(_log.ARCHIVE_PRUNED, rows=total)
    return total


def _retire_days(app: Outbox, older_than: float, phase: Phase) -> int:
    """On an archive partitioned by day, the days archived wholly before the age lose their
    history in one statement each, as retention takes them (their dead letters stay), rather
    than row by row; the rows they held. A day whose lock is held too long, or while a
    retention pass holds the cleaners' lock, is left to the row-by-row prune that follows."""
    total = 0
    with app.engine.connect() as conn:
        with conn.begin():
            listed = queries.archive_days(conn)
            if listed is None:
                return 0
            now = queries.database_now(conn)
            now = now.replace(tzinfo=dt.UTC) if now.tzinfo is None else now
            cutoff = (now - dt.timedelta(seconds=older_than)).astimezone(dt.UTC).date()
            days = [day for day in listed if day < cutoff]
        for day in days:
            phase.check()
            try:
                with conn.begin(), queries.retention_lock(conn) as held:
                    if not held:
                        break
                    history = queries.count_archive_day_history(conn, day)
                    queries.retire_archive_day(conn, day, DAY_LOCK_WAIT)
            except DBAPIError as error:
                if not is_lock_timeout(error):
                    raise
                continue
            total += history
            phase.advance(history)
    return total


def count_up_to(app: Outbox, **filters: Any) -> int | None:
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
