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
distributes: one conditional UPDATE of ``outbox_handlers.distributed_tick``, which exactly one
caller of a tick wins (:func:`take_tick`). The others learn that they lost and do nothing, so
any number of schedulers cost one distribution per tick. The tick is read from the database's
clock, one clock for every host.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._db import buffer_table_missing, queries, run_in_transaction
from outbox._engine.claimer import claimable, partial_batch_due
from outbox.app import Outbox
from outbox.handler import Handler

log = _log.get_logger(__name__)

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

    try:
        result = run_in_transaction(app.engine, work, patience=patience)
    except DBAPIError as error:
        missing = buffer_table_missing(app.engine, error, {handler.name: handler.table})
        if missing is None:
            raise
        raise missing from error
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
    return [distribute_handler(app, h, patience=patience) for h in app.select_handlers(handlers)]


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


def run_on_tick(
    app: Outbox, tick: int, handlers: tuple[str, ...] | list[str] = (), *, patience: float = 0.0
) -> list[TickDistribution]:
    """For every handler (or the named ones): take ``tick``, and distribute when it was won.

    Taking the tick and distributing are two transactions: a caller stopped between them
    loses that tick's distribution for the handler, and the next tick makes up for it.
    """
    done = []
    for handler in app.select_handlers(handlers):
        if take_tick(app, handler.name, tick, patience=patience):
            done.append(
                TickDistribution(
                    handler.name, True, distribute_handler(app, handler, patience=patience)
                )
            )
        else:
            done.append(TickDistribution(handler.name, False, None))
    return done
