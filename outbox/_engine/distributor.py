"""The distributor: turns unclaimed rows into claim jobs, per handler.

For each handler it counts unclaimed rows (a capped count) and keeps
``min(ceil(unclaimed / batch_size), max_batches)`` claim jobs pending; with ``max_wait``, a
last partial batch counts only once its oldest event has waited that long. The count stops
after ``COUNTED_BATCHES`` batches: a backlog that deep fills every free slot, and the claim
jobs, which keep claiming while rows wait, find out the rest. A claim job that finds the
buffer drained deletes the ones still pending, so filling too many costs little. Claim jobs live in
numbered slots with a unique index, so two overlapping runs (two crons, two worker leaders)
never enqueue more than needed: both fill the same lowest free slots, and the second insert of
a slot does nothing.

A caller on a schedule (cron on several hosts, several Celery beats, a web application's
task in each of its processes) takes the schedule's *tick* for each handler before it
distributes: ``outbox_handlers.distributed_tick`` moved forward, which exactly one caller of a
tick does for each handler (:func:`take_ticks`, for all the handlers in one transaction). The
others learn that they lost and do nothing, so any number of schedulers cost one distribution
per tick. The tick is read from the database's
clock, one clock for every host.

What a run costs follows the buffers with events waiting, not every buffer there is: one
statement first finds the buffers with any unclaimed row (one index probe each, a few hundred
buffers to a statement), and only their handlers count and enqueue, in a transaction each.
A handler whose buffer is empty needs no claim job, which is what its count would have found,
so it is left at that; the claim jobs it still has are read for all of them in one statement.
The tick is taken for all the handlers in one transaction. An application of 1,000
buffers of which 10 have events sends about the statements one of 10 buffers sends
(``python -m benchmarks.idle_buffers``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._db import buffer_table_missing, queries, run_in_transaction
from outbox._engine.claimer import claimable, partial_batch_due
from outbox.app import Outbox
from outbox.exceptions import BufferTableMissingError
from outbox.handler import Handler

log = _log.get_logger(__name__)
T = TypeVar("T")

# Beyond this many waiting batches the exact number changes nothing worth a longer count: the
# count reads one index entry per row, about 0.1 ms per thousand on PostgreSQL.
COUNTED_BATCHES = 8
# Ticks are named by their start in whole milliseconds: a shorter interval would give two
# ticks one name.
MIN_TICK_SECONDS = 0.001
# The longest tick: a week. A longer interval is a typo (milliseconds given as seconds).
MAX_TICK_SECONDS = 7 * 86_400.0
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class Distribution:
    """What one distribution did for one handler."""

    handler: str
    unclaimed: int
    """Unclaimed rows counted, at most ``batch_size * min(max_batches, COUNTED_BATCHES)``."""
    capped: bool
    pending: int
    """Claim jobs that were already pending."""
    enqueued: int

    def summary(self) -> str:
        """One line for the CLI."""
        more = "+" if self.capped else ""
        return (
            f"{self.handler}: {self.unclaimed}{more} unclaimed, {self.pending} claim jobs pending,"
            f" {self.enqueued} enqueued"
        )


def distribute_handler(
    app: Outbox, handler: Handler[Any], *, patience: float = 0.0
) -> Distribution:
    """Enqueue the claim jobs one handler needs, in one short transaction.

    ``patience``: seconds to keep retrying through a database outage before giving up.
    A buffer table that does not exist raises BufferTableMissingError.
    """
    cap = handler.batch_size * min(handler.max_batches, COUNTED_BATCHES)

    def work(conn: Connection) -> Distribution:
        # Rows a claim may not take now (an ordered handler's held back) need no claim job.
        unclaimed = queries.count_unclaimed(conn, handler.table, cap, claimable(handler))
        full, partial = divmod(unclaimed, handler.batch_size)
        if partial and not partial_batch_due(conn, handler):
            partial = 0
        needed = handler.max_batches if unclaimed >= cap else full + (1 if partial else 0)
        needed = min(needed, handler.max_batches)
        taken = queries.claim_job_slots(conn, handler.name)
        missing = needed - len(taken)
        free = [s for s in range(handler.max_batches) if s not in taken][: max(missing, 0)]
        enqueued = queries.insert_claim_jobs(
            conn, app.dialect, handler.name, free, handler.urgency.priority
        )
        if enqueued and app.supports.listen_notify:
            queries.notify_jobs(conn)
        return Distribution(handler.name, unclaimed, unclaimed >= cap, len(taken), enqueued)

    result = _run(app, handler, work, patience)
    if result.enqueued:
        log.info(
            _log.CLAIMS_ENQUEUED,
            handler=handler.name,
            unclaimed=result.unclaimed,
            enqueued=result.enqueued,
        )
    return result


def run_once(
    app: Outbox, handlers: tuple[str, ...] | list[str] = (), *, patience: float = 0.0
) -> list[Distribution]:
    """Distribute once for every handler (or the named ones); returns what each one did."""
    return distribute(app, app.select_handlers(handlers), patience=patience)


def distribute(
    app: Outbox,
    handlers: Sequence[Handler[Any]],
    *,
    patience: float = 0.0,
    on_missing: Callable[[Mapping[str, str]], None] | None = None,
) -> list[Distribution]:
    """Distribute for ``handlers``, in their order; what each one did.

    The handlers whose buffers have no unclaimed row are found first, in one statement for
    them all (:func:`waiting_tables`), and do nothing more: a count would find nothing to
    enqueue. The others distribute one by one (:func:`distribute_handler`). ``on_missing``:
    called with the handlers whose buffer table does not exist (handler -> table), which are
    left out of the result, the others distributed all the same; None: BufferTableMissingError
    is raised.
    """
    taken = []
    for handler in handlers:
        try:
            take_flagged_rows(app, handler, patience)
        except BufferTableMissingError as error:
            if on_missing is None:
                raise
            on_missing(error.missing)
            continue
        taken.append(handler)
    handlers = taken
    waiting = waiting_tables(app, handlers, patience=patience)
    idle = [h.name for h in handlers if h.table not in waiting]
    pending = (
        run_in_transaction(
            app.engine, lambda conn: queries.claim_jobs_pending(conn, idle), patience=patience
        )
        if idle
        else {}
    )
    done = []
    for handler in handlers:
        if handler.table not in waiting:
            done.append(Distribution(handler.name, 0, False, pending.get(handler.name, 0), 0))
            continue
        try:
            done.append(distribute_handler(app, handler, patience=patience))
        except BufferTableMissingError as error:
            if on_missing is None:
                raise
            on_missing(error.missing)
    return done


def take_flagged_rows(app: Outbox, handler: Handler[Any], patience: float = 0.0) -> int:
    """For a flag handler, put the keys of newly flagged rows in its buffer (up to
    ``max_batches`` groups of them at a time), in a transaction of their own, before its
    buffer is counted; how many. A table that does not exist raises
    BufferTableMissingError."""
    source = handler.flags
    if source is None:
        return 0

    def work(conn: Connection) -> int:
        return queries.pump_flagged_rows(
            conn,
            app.dialect,
            handler.table,
            source.table,
            source.flagged(),
            source.version_column(),
            handler.batch_size * handler.max_batches,
        )

    taken: int = _run(app, handler, work, patience)
    if taken:
        log.debug(_log.FLAGS_TAKEN, handler=handler.name, rows=taken)
    return taken


def _run(app: Outbox, handler: Handler[Any], work: Callable[[Connection], T], patience: float) -> T:
    """``work`` in a transaction; BufferTableMissingError in place of the database's error when
    one of the handler's tables does not exist."""
    try:
        return run_in_transaction(app.engine, work, patience=patience)
    except DBAPIError as error:
        missing = buffer_table_missing(app.engine, error, {handler.name: handler.tables})
        if missing is None:
            raise
        raise missing from error


def waiting_tables(
    app: Outbox, handlers: Sequence[Handler[Any]], *, patience: float = 0.0
) -> set[Table]:
    """The buffer tables of ``handlers`` where any row waits unclaimed, found in one statement
    per few hundred buffers (``queries.tables_with_unclaimed``). Every one for a single
    handler, whose own count finds out as soon, and when a buffer table does not exist: each
    handler's distribution then finds out which, as it would alone."""
    tables = list(dict.fromkeys(h.table for h in handlers))
    if len(handlers) <= 1:
        return set(tables)
    try:
        return run_in_transaction(
            app.engine,
            lambda conn: queries.tables_with_unclaimed(conn, tables),
            patience=patience,
        )
    except DBAPIError as error:
        by_name = {h.name: h.table for h in handlers}
        if buffer_table_missing(app.engine, error, by_name) is None:
            raise
        return set(tables)


def enqueued(results: list[Distribution]) -> int:
    """How many claim jobs a run enqueued in all."""
    return sum(r.enqueued for r in results)


def check_tick_seconds(every: float) -> float:
    """``every`` as a tick's length in seconds; ValueError naming it when it is not a number
    from :data:`MIN_TICK_SECONDS` to :data:`MAX_TICK_SECONDS`."""
    if (
        isinstance(every, bool)
        or not isinstance(every, int | float)
        or math.isnan(every)
        or not MIN_TICK_SECONDS <= every <= MAX_TICK_SECONDS
    ):
        raise ValueError(
            f"every must be {MIN_TICK_SECONDS:g} to {MAX_TICK_SECONDS:g} seconds, got {every!r}"
        )
    return float(every)


def tick_of(now: dt.datetime, every: float) -> int:
    """The tick of ``every`` seconds that ``now`` falls in, named by its start: whole
    milliseconds since the Unix epoch of ``floor(now / every) * every``.

    Named by when it starts rather than by its number, ticks of different lengths compare:
    a caller with ``every=60`` that finds a tick taken within its minute by a caller with
    ``every=5`` loses that minute, and takes the next. ``now`` is the database's clock
    (:func:`database_tick`); a time without a zone is UTC, as outbox stores every time.
    """
    every_micros = round(check_tick_seconds(every) * 1_000_000)
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)
    micros = (now - _EPOCH) // dt.timedelta(microseconds=1)
    return (micros // every_micros) * every_micros // 1000


def database_tick(app: Outbox, every: float) -> int:
    """The tick of ``every`` seconds the database's clock is in now (:func:`tick_of`)."""
    check_tick_seconds(every)
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
    return tick_of(now, every)


def take_tick(app: Outbox, handler: str, tick: int, *, patience: float = 0.0) -> bool:
    """Take ``tick`` for ``handler``, in a short transaction of its own: True for the one
    caller of the tick that wins (it distributes), False when another caller took this tick
    or a later one. The handler's row is made first, in a transaction of its own, when it
    has none (see ``queries.ensure_handler_row``)."""

    def take(conn: Connection) -> bool | None:
        return queries.take_distribution_tick(conn, handler, tick)

    won = run_in_transaction(app.engine, take, patience=patience)
    if won is None:
        run_in_transaction(
            app.engine,
            lambda conn: queries.ensure_handler_row(conn, app.dialect, handler),
            patience=patience,
        )
        won = run_in_transaction(app.engine, take, patience=patience)
    return bool(won)


@dataclass(frozen=True, slots=True)
class TickDistribution:
    """What one caller of a tick did for one handler."""

    handler: str
    won: bool
    """This caller took the tick and distributed; False: another caller had it."""
    distribution: Distribution | None
    """What the distribution did; None when the tick was lost."""


def take_ticks(
    app: Outbox, handlers: Sequence[str], tick: int, *, patience: float = 0.0
) -> set[str]:
    """Take ``tick`` for each of ``handlers`` at once (:func:`take_tick` for each, in one short
    transaction for them all): the handlers whose tick this caller won. The rows of handlers
    that have none are made first, in a transaction of their own."""

    def take(names: Sequence[str]) -> tuple[list[str], list[str]]:
        return run_in_transaction(
            app.engine,
            lambda conn: queries.take_distribution_ticks(conn, names, tick),
            patience=patience,
        )

    won, without_row = take(handlers)
    if without_row:

        def make_rows(conn: Connection) -> None:
            for name in without_row:
                queries.ensure_handler_row(conn, app.dialect, name)

        run_in_transaction(app.engine, make_rows, patience=patience)
        won += take(without_row)[0]
    return set(won)


def run_on_tick(
    app: Outbox, tick: int, handlers: tuple[str, ...] | list[str] = (), *, patience: float = 0.0
) -> list[TickDistribution]:
    """For every handler (or the named ones): take ``tick``, and distribute when it was won.

    The tick is taken for all of them in one transaction (:func:`take_ticks`), then the
    handlers whose tick was won distribute (:func:`distribute`). Taking the tick and
    distributing are separate transactions: a caller stopped between them loses that tick's
    distribution, and the next tick makes up for it.
    """
    selected = app.select_handlers(handlers)
    won = take_ticks(app, [h.name for h in selected], tick, patience=patience)
    done = {
        d.handler: d
        for d in distribute(app, [h for h in selected if h.name in won], patience=patience)
    }
    return [TickDistribution(h.name, h.name in won, done.get(h.name)) for h in selected]
