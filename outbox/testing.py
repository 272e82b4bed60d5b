"""Helpers for the tests of applications that use outbox.

``drain(app)`` runs everything that is due now, synchronously in the calling thread, through
the real code paths: distribution, claims, batch jobs, retries that are already due. Async
handlers run on outbox's own event loop thread, as in a worker, so ``drain`` works the same
when called from inside a running event loop (an async test, an async endpoint); it blocks
that loop while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox._db import check_buffer_tables
from outbox._engine import distributor
from outbox.app import Outbox
from outbox.worker import Worker, WorkerStats

DEFAULT_MAX_ROUNDS = 10_000


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain did."""

    jobs: int
    stats: WorkerStats


def drain(
    app: Outbox,
    *,
    handlers: tuple[str, ...] | list[str] = (),
    max_rounds: int = DEFAULT_MAX_ROUNDS,
) -> DrainResult:
    """Distribute, claim and handle until nothing is due now; returns what was done.

    Retries scheduled for later are left for later: a test that wants them sooner gives the
    handler a ``RetryPolicy`` with short delays. Handler objects are started and stopped around
    the drain as a worker starts and stops them (:mod:`outbox.lifecycle`): a ready-made sink
    connects and checks its downstream first, and closes its connections at the end. Raises
    ``RuntimeError`` after ``max_rounds`` rounds, which means a handler keeps producing work,
    and ``BufferTableMissingError`` when a handler's buffer table does not exist.
    """
    worker = Worker(app, concurrency=1, handlers=handlers)
    check_buffer_tables(app.engine, {name: h.table for name, h in worker.handlers.items()})
    worker.start_handlers()
    try:
        return _drain(app, worker, max_rounds)
    finally:
        worker.flush_throughput()
        worker.stop_handlers()


def _drain(app: Outbox, worker: Worker, max_rounds: int) -> DrainResult:
    jobs = 0
    for _ in range(max_rounds):
        ran = worker.run_once()
        jobs += ran
        if ran:
            continue
        worker.rescue()
        if not distributor.enqueued(distributor.run_once(app, list(worker.handlers))):
            if not worker.run_once():
                return DrainResult(jobs, worker.stats)
            jobs += 1
    raise RuntimeError(f"drain did not finish within {max_rounds} rounds")
