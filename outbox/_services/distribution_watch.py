"""The distribution watch: says when events wait and nothing distributes for their handler.

Distribution (``outbox distribute`` from cron, or the fleet's leader) leaves a claim job for
waiting events, and a claim job lives until a claim finds its buffer drained. Events that wait
long while their handler has no claim job at all therefore mean that nothing distributes: every
worker was started with ``--no-distribute`` and no cron runs ``outbox distribute``. ``outbox
status`` and ``outbox check`` raise an alert; a worker that leaves distribution to others logs
``outbox.distribute.missing``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from outbox._core import log as _log
from outbox._core.durations import Timed
from outbox._db import queries
from outbox.app import Outbox
from outbox.handler import Handler

log = _log.get_logger(__name__)

# How long an event may wait with no claim job before the watch says that nothing distributes:
# three minutes, so that `outbox distribute` run from cron every minute (cron's finest period)
# never raises it, even with a run late or skipped, while a fleet that distributes nothing is
# told within a few minutes, inside the promise of every band but REALTIME (whose staleness
# alert, at 60 s, comes first). A handler's ``max_wait`` comes on top: its partial batches are
# not distributed before it.
UNDISTRIBUTED_ALERT_SECONDS = 180.0

WHAT_TO_DO = "run `outbox distribute` from cron or start workers without --no-distribute"


def undistributed_age(conn: Connection, handler: Handler[Any]) -> float | None:
    """Seconds the handler's oldest claimable event has waited with no claim job; None when
    none waits or a claim job exists. An ordered handler's rows held back behind their key
    are not claimable, and do not count."""
    only = (
        None
        if handler.ordering_key is None
        else queries.in_order(handler.table, handler.ordering_key, handler.name)
    )
    return queries.undistributed_age(conn, handler.table, handler.name, only)


def alert_after(handler: Handler[Any]) -> float:
    """Seconds an event of ``handler`` waits with no claim job before the alert is raised."""
    return UNDISTRIBUTED_ALERT_SECONDS + (handler.max_wait or 0.0)


def alert_text(age: float) -> Timed:
    """The alert in words: how long, and what to do."""
    return Timed(
        "oldest unclaimed event has waited ",
        age,
        f" with no claim job: nothing distributes ({WHAT_TO_DO})",
    )


@dataclass
class DistributionWatch:
    """Run by a worker that leaves distribution to others, while it leads the fleet (one line
    per fleet, not one per worker): logs ``outbox.distribute.missing`` once per handler when
    its events start waiting undistributed, and again only after they were distributed."""

    app: Outbox
    worker_id: str
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

    def run_once(self, handlers: Iterable[str]) -> dict[str, float]:
        """Look at each handler once; returns the handlers whose events wait undistributed
        past :func:`alert_after`, with the age of the oldest."""
        selected = [self.app.handlers[name] for name in handlers]
        tables = list(dict.fromkeys(h.table for h in selected))
        with self.app.engine.connect() as conn:
            # Only a buffer with a row unclaimed can have one waiting undistributed: the empty
            # ones are found in one statement rather than looked into one by one.
            waiting = queries.tables_with_unclaimed(conn, tables) if len(tables) > 1 else tables
            ages = {
                h.name: undistributed_age(conn, h) if h.table in waiting else None for h in selected
            }
        late = {
            h.name: age
            for h in selected
            if (age := ages[h.name]) is not None and age > alert_after(h)
        }
        for name, age in late.items():
            if name not in self._warned:
                log.warning(
                    _log.DISTRIBUTION_MISSING,
                    worker=self.worker_id,
                    handler=name,
                    waited=round(age, 1),
                    advice=WHAT_TO_DO,
                )
        self._warned = set(late)
        return late
