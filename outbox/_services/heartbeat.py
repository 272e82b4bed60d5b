"""The heartbeat: a worker tells the fleet it lives, keeps the leases of the jobs it runs, and
learns how many workers there are and whether it leads them."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outbox._db import queries, run_in_transaction
from outbox.app import Outbox


@dataclass(frozen=True)
class Beat:
    """What one heartbeat learned."""

    live_workers: int
    """Workers whose heartbeat is recent, this one included (at least 1)."""
    leading: bool
    """Whether this worker leads the fleet (the oldest live one): it distributes."""


@dataclass
class Heartbeat:
    """One worker's heartbeat. ``running``: the ids of the jobs it runs now, whose leases are
    extended; only those, so that a job whose finishing write failed runs out its lease and is
    rescued. ``stopping``: a stopping worker does not put back a row it deleted."""

    app: Outbox
    worker_id: str
    concurrency: int
    running: Callable[[], Sequence[int]]
    stopping: Callable[[], bool]

    def run_once(self) -> Beat:
        """Touch (or insert) the worker's row, extend its leases, count the fleet and find its
        leader, in one transaction."""
        settings = self.app.settings
        running = list(self.running())

        def work(conn: Any) -> Beat:
            if not queries.touch_worker(conn, self.worker_id) and not self.stopping():
                queries.insert_worker(
                    conn, self.worker_id, socket.gethostname(), os.getpid(), self.concurrency
                )
            queries.extend_leases(conn, self.worker_id, running, settings.lease_seconds)
            live = queries.count_live_workers(conn, settings.worker_stale_after)
            leader = queries.leader_worker_id(conn, settings.worker_stale_after)
            return Beat(max(live, 1), leader == self.worker_id)

        return run_in_transaction(self.app.engine, work)
