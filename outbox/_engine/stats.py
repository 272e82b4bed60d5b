"""Counters of what a runner did: claims made and groups handled, by outcome.

A worker keeps one for its whole run (:attr:`outbox.worker.Worker.stats`), and
``outbox.testing.drain`` one per drain (:attr:`outbox.testing.DrainResult.stats`); the runner
counts into it as it runs jobs, from any thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from outbox.results import (
    DEAD,
    DEFERRED,
    LEASE_LOST,
    REFUSED,
    RETRYING,
    SUCCEEDED,
    THROTTLED,
    BatchResult,
)


@dataclass
class WorkerStats:
    """Counters of what a worker did (read them after :meth:`outbox.worker.Worker.run`)."""

    claims: int = 0
    groups_succeeded: int = 0
    groups_retried: int = 0
    groups_deferred: int = 0
    groups_throttled: int = 0
    groups_dead: int = 0
    groups_refused: int = 0
    leases_lost: int = 0
    events_succeeded: int = 0
    events_retried: int = 0
    events_deferred: int = 0
    events_discarded: int = 0
    events_dead: int = 0
    events_expired: int = 0
    events_superseded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_claim(self) -> None:
        """Count one group claimed."""
        with self._lock:
            self.claims += 1

    def record(self, result: BatchResult) -> None:
        """Count one batch result."""
        with self._lock:
            if result.outcome == SUCCEEDED:
                self.groups_succeeded += 1
            elif result.outcome == RETRYING:
                self.groups_retried += 1
            elif result.outcome == DEFERRED:
                self.groups_deferred += 1
            elif result.outcome == THROTTLED:
                self.groups_throttled += 1
            elif result.outcome == DEAD:
                self.groups_dead += 1
            elif result.outcome == REFUSED:
                self.groups_refused += 1
            elif result.outcome == LEASE_LOST:
                self.leases_lost += 1
            self.events_succeeded += result.succeeded
            self.events_retried += result.retried
            self.events_deferred += result.deferred
            self.events_discarded += result.discarded
            self.events_dead += result.dead
            self.events_expired += result.expired
            self.events_superseded += result.superseded


def stopped_fields(stats: WorkerStats) -> dict[str, int]:
    """The counts a stopping worker's line carries (``outbox.worker.stopped``)."""
    return {
        "groups_succeeded": stats.groups_succeeded,
        "groups_retried": stats.groups_retried,
        "groups_deferred": stats.groups_deferred,
        "groups_dead": stats.groups_dead,
        "groups_refused": stats.groups_refused,
        "leases_lost": stats.leases_lost,
        "events_succeeded": stats.events_succeeded,
    }
