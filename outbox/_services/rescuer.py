"""The rescuer: frees the jobs whose holder is gone (its heartbeat stopped) or whose lease ran
out (their worker died or stalled) for another worker, and forgets the workers that stopped
heartbeating."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox._services.heartbeat import older_release_stale_after
from outbox.app import Outbox

log = _log.get_logger(__name__)


def _never() -> bool:
    return False


@dataclass
class Rescuer:
    """The rescue a worker runs every ``rescue_interval``; any worker's rescue frees any job.

    ``judge_heartbeats``: whether this worker may take a silent worker for gone and rescue its
    jobs before their leases run out (its own heartbeats have been steady: see
    :meth:`outbox._services.heartbeat.Heartbeat.may_judge_others`); by default it may not, and
    frees expired leases only, and forgets no worker.
    """

    app: Outbox
    worker_id: str
    judge_heartbeats: Callable[[], bool] = _never

    def run_once(self) -> int:
        """Free the jobs of gone workers and delete their rows (when this worker may judge),
        and free expired leases, in one transaction; returns how many jobs were freed (their
        attempt stays counted)."""
        stale = self.app.settings.worker_stale_after
        judge = self.judge_heartbeats()

        def work(conn: Any) -> tuple[int, int]:
            gone = 0
            if judge:
                # Before their rows go: a gone worker is known by its row's last heartbeat.
                gone = queries.rescue_jobs_of_gone_workers(conn, self.app.dialect, stale)
                # Forgetting a worker is judging it gone too: a worker that may not judge
                # leaves the row, so that one that may still finds the jobs it held.
                queries.delete_stale_workers(
                    conn, stale, older_release_stale_after(self.app.settings)
                )
            return gone, queries.rescue_expired_jobs(conn, self.app.dialect)

        gone, expired = run_in_transaction(self.app.engine, work)
        if gone or expired:
            log.warning(
                _log.JOBS_RESCUED,
                worker=self.worker_id,
                jobs=gone + expired,
                holder_gone=gone,
                lease_expired=expired,
            )
        return gone + expired
