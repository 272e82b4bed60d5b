"""Fan-outs as an operator sees them (:meth:`outbox.Outbox.fanout`): each one's source and
consumers and what waits in each (:func:`fanouts`), which buffers a fan-out copies into and
whose copies a handler drains (:func:`copies_into`, :func:`copy_of`), and a consumer added
later started from the events the archive still keeps (:func:`backfill`).

``outbox fanout list``, ``outbox status``, ``GET /api/v1/fanouts`` and the console's handler
pages ask these functions, so that they agree.

*Starting a consumer later.* A consumer added to ``to=[...]`` gets every event the fan-out
copies from then on: by itself it starts from now. A fan-out that archives (``archive=True``)
keeps each event it copied in ``outbox_archive`` (succeeded, under the fan-out's name, the
source's columns as its payload) for the archive's retention, and :func:`backfill` copies
those into the new consumer's buffer: it starts from everything still kept.

*No event twice.* Nothing records which consumers a fan-out copied an archived event into:
the consumer's buffer is the only record, and only of the copies it has not handled yet. So a
backfill copies the archived events the consumer's buffer does not hold, and is only right
while its handler has removed nothing from it: the handler is paused before the fan-out first
copies into it, and stays paused until the backfill is done (each chunk checks it, the
handler's row locked so that a resume waits for the chunk). Once it has run, its buffer no
longer says what it got: a second backfill is refused unless the handler has stayed paused
since the last one (which then goes on where an interrupted one stopped, copying nothing
twice). Events archived by workers that did not copy into the consumer yet (a rolling
deploy) are not in its buffer, and are copied like older ones.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, Table

from outbox import schema
from outbox._core import log as _log
from outbox._core.values import archived_payload
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError, ReplayError
from outbox.fanout import copied_columns
from outbox.handler import MAX_BATCH_SIZE, Handler
from outbox.ops import operators
from outbox.ops.archive import count_up_to
from outbox.ops.progress import Phase, Progress
from outbox.ops.replay import stored_values

__all__ = [
    "BACKFILL_CHUNK",
    "COUNT_CAP",
    "BackfillPlan",
    "BackfillResult",
    "Consumer",
    "ConsumerStatus",
    "FanoutStatus",
    "backfill",
    "backfill_plan",
    "copies_into",
    "copy_of",
    "fanouts",
]

log = _log.get_logger(__name__)

COUNT_CAP = 100_000
"""Events counted per buffer at most: past it, a count says "at least"
(:attr:`FanoutStatus.capped_at`)."""
BACKFILL_CHUNK = 500
"""Archived events a backfill reads per transaction."""

_SUCCEEDED = frozenset({schema.ArchiveStatus.SUCCEEDED.value})


@dataclass(frozen=True, slots=True)
class Consumer:
    """A buffer a fan-out copies into, and the handler of this application that drains it."""

    table: str
    """Its buffer table (``schema.table`` when it has a schema)."""
    handler: str | None
    """The handler draining it here; None: none in this application (its copies wait until
    one does, here or in another application)."""


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """A consumer's buffer: what waits in it. Ages are float seconds, by the database clock."""

    table: str
    handler: str | None
    """The handler draining it here (its backlog and age are that handler's status too);
    None: none in this application."""
    events: int
    """Events in its buffer, waiting or in groups (a count that reached the cap: at least)."""
    oldest_age: float | None
    """Seconds since the oldest of them was written to the source; None when it is empty."""


@dataclass(frozen=True, slots=True)
class FanoutStatus:
    """One fan-out: its source, whether it archives, and each consumer."""

    name: str
    """The fan-out's handler (``<source table>.fanout`` unless named)."""
    source: str
    """The buffer the application writes."""
    archives: bool
    """Whether it keeps the events it copied in the archive: a consumer added later can start
    from them (:func:`backfill`); otherwise it starts from its addition."""
    events: int
    """Events in the source not copied yet, waiting or in groups."""
    oldest_age: float | None
    """Seconds since the oldest of them was written; None when the source is empty."""
    consumers: list[ConsumerStatus]
    """In the order ``to=[...]`` gives them."""
    capped_at: int | None
    """The cap the counts were read with; None: exact counts."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``--json``)."""
        return asdict(self)


def copies_into(app: Outbox, fanout: str) -> list[Consumer]:
    """The consumers of the fan-out ``fanout``, in the order ``to=[...]`` gives them; empty
    when no fan-out has that name (a handler of its own, or none)."""
    handler = app.handlers.get(fanout)
    if handler is None:
        return []
    return [
        Consumer(model.__table__.fullname, _drainer(app, model.__table__))
        for model in handler.copy_to
    ]


def copy_of(app: Outbox, handler: str) -> str | None:
    """The fan-out whose copies the handler ``handler`` drains; None when it drains a buffer
    the application writes (or no handler has that name)."""
    drained = app.handlers.get(handler)
    if drained is None:
        return None
    for fanout in _fanouts(app):
        if any(model.__table__ is drained.table for model in fanout.copy_to):
            return fanout.name
    return None


def fanouts(
    app: Outbox, count_cap: int | None = COUNT_CAP, handlers: Collection[str] = ()
) -> list[FanoutStatus]:
    """Every fan-out of ``app`` (those of ``handlers`` only, when given: the selection of
    ``outbox status --handler``), by name: its source and consumers with the events waiting
    in each and the oldest one's age, read on one connection.

    ``count_cap``: count each buffer's events no further than this (one bounded walk of its
    primary key; the ages are one ``LIMIT 1`` each); None: exact counts, which read every
    row."""
    if count_cap is not None and (
        isinstance(count_cap, bool) or not isinstance(count_cap, int) or count_cap < 1
    ):
        raise ValueError(f"count_cap must be a whole number >= 1, got {count_cap!r}")
    chosen = {h.name for h in app.select_handlers(list(handlers))}
    found = sorted((h for h in _fanouts(app) if h.name in chosen), key=lambda h: h.name)
    if not found:
        return []
    with app.engine.connect() as conn:
        return [
            FanoutStatus(
                name=fanout.name,
                source=fanout.table.fullname,
                archives=fanout.archive,
                **_reading(conn, fanout.table, count_cap),
                consumers=[
                    ConsumerStatus(
                        model.__table__.fullname,
                        _drainer(app, model.__table__),
                        **_reading(conn, model.__table__, count_cap),
                    )
                    for model in fanout.copy_to
                ],
                capped_at=count_cap,
            )
            for fanout in found
        ]


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """What a backfill of a consumer would start from, checked as a backfill checks it."""

    fanout: str
    consumer: str
    """The consumer's buffer table."""
    handler: str | None
    """The handler draining it here (paused, as a backfill needs); None: none here."""
    archived: int | None
    """Events the fan-out's archive keeps, each copied unless the consumer's buffer holds it
    already; None: more than :data:`outbox.ops.progress.COUNT_CAP`."""
    resumes: int | None
    """The backfill of the consumer recorded before, which this one goes on from (its
    handler has stayed paused since); None: none."""


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What a backfill did (or, with ``dry_run``, would do)."""

    fanout: str
    consumer: str
    """The consumer's buffer table."""
    handler: str | None
    copied: int
    """Archived events copied into the consumer's buffer, each under its own id."""
    held: int
    """Archived events its buffer holds already (copied by the fan-out since the consumer
    was added, or by an earlier backfill): left as they are."""
    dry_run: bool = False
    operation_id: int | None = None
    """The backfill's record (:func:`outbox.ops.operators.history`, a ``replay`` whose
    selection names the consumer as ``backfill``); None for a dry run."""


def backfill_plan(app: Outbox, consumer: str) -> BackfillPlan:
    """Check that ``consumer`` may be backfilled now (see :func:`backfill`), and count what
    the fan-out's archive keeps for it (up to :data:`outbox.ops.progress.COUNT_CAP`), without
    reading the events: what ``outbox fanout backfill`` says before it is told ``--yes``."""
    fanout, table, handler = _resolve(app, consumer)
    with app.engine.connect() as conn:
        resumes = _checked(conn, fanout, table, handler)
    archived = count_up_to(app, handler=fanout.name, statuses=_SUCCEEDED)
    return BackfillPlan(fanout.name, table.fullname, handler, archived, resumes)


def backfill(
    app: Outbox,
    consumer: str,
    *,
    dry_run: bool = False,
    chunk: int = BACKFILL_CHUNK,
    actor: str | None = None,
    progress: Progress | None = None,
) -> BackfillResult:
    """Start the consumer ``consumer`` of a fan-out from everything the archive still keeps:
    copy the fan-out's archived (succeeded) events into its buffer, each under its own id and
    ``created_at``, as the fan-out's own copy would have.

    ``consumer``: the name of the handler that drains the consumer's buffer, or the buffer's
    table name (a consumer with no handler in this application); another name is refused in
    one line listing the consumers. A fan-out that does not archive is refused: it keeps
    nothing to start from (``archive=True`` keeps the events fanned out from then on).

    The consumer's handler is paused from before the fan-out's first copy into it until the
    backfill is done (``outbox pause``, :func:`outbox.ops.flow.pause`): its buffer is how
    the backfill tells the events the fan-out copied into it from those it never got, and an
    event it has handled is gone from it. A backfill is refused while the handler is not
    paused, and stops between chunks if it is resumed. It runs once per consumer: after a
    recorded backfill, another is refused unless the handler has stayed paused since (then
    it goes on where an interrupted one stopped); resumed or paused anew, the handler may
    have handled events that another backfill would copy again. A consumer with no handler
    in this application has nothing to pause here.
    Events its buffer holds are counted (``held``) and left; the archive's rows are left as
    they are (not marked replayed), for other consumers to start from.

    Runs in chunks of ``chunk`` archived events, one transaction each, which also adds what it
    copied to its record: an operation ``replay`` by ``actor`` (default: ``user@host``) whose
    selection names the fan-out and the consumer (``backfill``). ``dry_run``: checks and
    counts, writes nothing. ``progress`` (:class:`~outbox.ops.progress.Progress`) is told the
    archived events to read and each chunk; when it asks to stop,
    :class:`~outbox.ops.progress.StoppedError` is raised between two chunks. An archived event
    whose values cannot be read back is left, named in the
    :class:`~outbox.exceptions.ReplayError` raised once the rest is copied.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_BATCH_SIZE:
        raise ConfigurationError(f"chunk: expected 1 to {MAX_BATCH_SIZE} events, got {chunk!r}")
    fanout, table, handler = _resolve(app, consumer)
    with app.engine.connect() as conn:
        _checked(conn, fanout, table, handler)
    operation_id = None
    if not dry_run:
        operation_id = operators.record(
            app,
            schema.OperationAction.REPLAY,
            operators.checked_actor(actor),
            _selection(fanout, table),
            detail=f"backfill of {table.fullname} from the archive of {fanout.name}",
        )
    total = None if dry_run else count_up_to(app, handler=fanout.name, statuses=_SUCCEEDED)
    phase = Phase(None if dry_run else progress, "backfilled", "archived events", total)
    columns = _columns(fanout.table, table)
    copied = held = 0
    failures: list[str] = []
    after_id = 0
    while True:
        phase.check(operation_id)
        with app.engine.connect() as conn:
            rows = queries.select_archived(
                conn,
                handler=fanout.name,
                statuses=_SUCCEEDED,
                group_id=None,
                after_id=after_id,
                limit=chunk,
            )
        if not rows:
            break
        after_id = int(rows[-1]["id"])
        events, unreadable = _events(app, rows, columns)
        failures += unreadable
        if operation_id is None:
            with app.engine.connect() as conn:
                done = _new(conn, table, events)
        else:
            done = _copy_chunk(app, table, handler, events, operation_id, copied)
        copied += len(done)
        held += len(events) - len(done)
        phase.advance(len(rows))
    phase.end()
    if operation_id is not None:
        log.info(
            _log.FANOUT_BACKFILLED,
            fanout=fanout.name,
            consumer=table.fullname,
            copied=copied,
            held=held,
            operation=operation_id,
        )
    if failures:
        raise ReplayError(
            f"{copied} events copied into {table.fullname}; {len(failures)} archived events "
            f"were not: {'; '.join(failures[:10])}"
        )
    return BackfillResult(fanout.name, table.fullname, handler, copied, held, dry_run, operation_id)


def _fanouts(app: Outbox) -> list[Handler[Any]]:
    return [h for h in app.handlers.values() if h.copy_to]


def _drainer(app: Outbox, table: Table) -> str | None:
    return next((h.name for h in app.handlers.values() if h.table is table), None)


def _reading(conn: Connection, table: Table, cap: int | None) -> dict[str, Any]:
    return {
        "events": queries.count_buffer_rows(conn, table, unclaimed=None, cap=cap),
        "oldest_age": queries.oldest_event_age(conn, table),
    }


def _resolve(app: Outbox, given: str) -> tuple[Handler[Any], Table, str | None]:
    """The fan-out, the buffer and the handler (if any) of the consumer named ``given``: a
    handler's name first, then a table's; a ConfigurationError listing the consumers."""
    found = [
        (fanout, model.__table__, _drainer(app, model.__table__))
        for fanout in _fanouts(app)
        for model in fanout.copy_to
    ]
    by_handler = [each for each in found if each[2] == given]
    by_table = [each for each in found if given in (each[1].name, each[1].fullname)]
    if by_handler or by_table:
        return (by_handler or by_table)[0]
    if not found:
        raise ConfigurationError(
            f"no consumer {given!r}: this application has no fan-out (Outbox.fanout)"
        )
    known = ", ".join(
        f"{handler} ({table.fullname})" if handler else f"{table.fullname} (no handler here)"
        for _, table, handler in found
    )
    raise ConfigurationError(
        f"no consumer {given!r} of a fan-out; the consumers, by handler or table: {known}"
    )


def _selection(fanout: Handler[Any], table: Table) -> str:
    """The record's selection, one text per consumer: what the check of an earlier backfill
    looks for."""
    return json.dumps({"backfill": table.fullname, "fanout": fanout.name}, sort_keys=True)


def _checked(
    conn: Connection, fanout: Handler[Any], table: Table, handler: str | None
) -> int | None:
    """Refuse a backfill that could hand the consumer an event twice, or that has nothing to
    start from; the recorded backfill it goes on from, if any."""
    if not fanout.archive:
        raise ConfigurationError(
            f"fan-out {fanout.name!r} does not archive its events: there is nothing kept to "
            f"start {table.fullname} from; app.fanout(..., archive=True) keeps the events "
            "fanned out from then on"
        )
    if handler is None:
        return None
    states = queries.handler_states(conn)
    if handler not in states or not states[handler].paused:
        raise ReplayError(
            f"handler {handler!r} of {table.fullname} is not paused: pause it (outbox pause "
            f"{handler}) before the fan-out copies into it, until the backfill is done; an "
            "event it has handled is gone from its buffer, and would be copied again"
        )
    earlier = queries.last_operation(
        conn, action=schema.OperationAction.REPLAY.value, selection=_selection(fanout, table)
    )
    if earlier is None:
        return None
    if not queries.paused_since_operation(conn, handler, earlier.id):
        raise ReplayError(
            f"{table.fullname} was backfilled already (operation {earlier.id}) and handler "
            f"{handler!r} has not stayed paused since (resumed, or paused again): a second "
            "backfill would copy again the events it may have handled"
        )
    return earlier.id


def _columns(source: Table, target: Table) -> list[Any]:
    """The source's columns a copy carries that the consumer's buffer has (all of them, as
    the fan-out checked), by which the archived payload, written of the source's rows, is
    read back."""
    named = {column.name: column for column in source.columns}
    kept = {column.name for column in target.columns}
    return [named[name] for name in copied_columns(source) if name in kept]


def _events(
    app: Outbox, rows: Iterable[dict[str, Any]], columns: list[Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The archived rows as the consumer's rows to insert, each under its event's id; and
    the rows that cannot be read back, each with why."""
    events: list[dict[str, Any]] = []
    failures: list[str] = []
    for row in rows:
        try:
            payload = archived_payload(row["payload"])
        except (ValueError, RecursionError) as error:
            failures.append(f"archive row {row['id']}: {type(error).__name__}")
            continue
        try:
            event = stored_values(columns, payload, app.engine.dialect)
        except ReplayError as error:
            failures.append(f"archive row {row['id']}: {error}")
            continue
        event["id"] = int(row["event_id"])
        events.append({"group_id": row["group_id"], "event": event})
    return events, failures


def _new(conn: Connection, table: Table, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of ``events``, those the consumer's buffer does not hold, each id once."""
    held = queries.existing_ids(conn, table, {e["event"]["id"] for e in events})
    new = []
    for event in events:
        event_id = event["event"]["id"]
        if event_id not in held:
            held.add(event_id)
            new.append(event)
    return new


def _copy_chunk(
    app: Outbox,
    table: Table,
    handler: str | None,
    events: list[dict[str, Any]],
    operation_id: int,
    copied: int,
) -> list[dict[str, Any]]:
    """Copy a chunk's events the consumer's buffer does not hold in one transaction, with
    the record's counts, while its handler stays paused; those copied."""

    def work(conn: Connection) -> list[dict[str, Any]]:
        if handler is not None and not queries.lock_pause(conn, handler):
            raise ReplayError(
                f"handler {handler!r} was resumed during the backfill of {table.fullname}, "
                f"which stopped: {copied} events copied (operation {operation_id}); those "
                "it has handled since would be copied again by another backfill"
            )
        new = _new(conn, table, events)
        if new:
            queries.insert_stored_rows(conn, table, [e["event"] for e in new])
        groups = len({e["group_id"] for e in new})
        queries.finish_operation(conn, operation_id, groups, len(new))
        return new

    return run_in_transaction(app.engine, work)
