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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from outbox import _log
from outbox._db import buffer_table_missing, queries, run_in_transaction
from outbox._engine.claimer import claimable, partial_batch_due
from outbox.app import Handler, Outbox

log = _log.get_logger(__name__)

# Beyond this many waiting batches the exact number changes nothing worth a longer count: the
# count reads one index entry per row, about 0.1 ms per thousand on PostgreSQL.
COUNTED_BATCHES = 8


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
