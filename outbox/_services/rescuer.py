"""The rescuer: frees the jobs whose lease ran out (their worker died or stalled) for another
worker, and forgets the workers that stopped heartbeating."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox import _log
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox

log = _log.get_logger(__name__)


@dataclass
class Rescuer:
    """The rescue a worker runs every ``rescue_interval``; any worker's rescue frees any job."""

    app: Outbox
    worker_id: str

    def run_once(self) -> int:
        """Free expired leases and delete stale worker rows, in one transaction; returns how
        many jobs were freed (their attempt stays counted)."""

        def work(conn: Any) -> int:
            queries.delete_stale_workers(conn, self.app.settings.worker_stale_after)
            return queries.rescue_expired_jobs(conn, self.app.dialect)

        rescued = run_in_transaction(self.app.engine, work)
        if rescued:
            log.warning(_log.JOBS_RESCUED, worker=self.worker_id, jobs=rescued)
        return rescued
