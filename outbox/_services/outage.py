"""What a worker says while the database does not answer: one line when an outage begins, not
one per statement that fails (a worker retries many times a second), and one when the
database answers again.

The worker, an executor's process and ``outbox.testing.drain`` each keep one, with their worker
id.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._db.dialects import error_summary


@dataclass
class Outage:
    """Whether the database was down at the last statement of the worker ``worker_id``, and
    the lines that say so, on ``log`` (the caller's, so that they keep its logger's name)."""

    worker_id: str
    log: _log.Logger
    down: bool = False

    def report(self, error: DBAPIError) -> None:
        """A statement failed: say so, with the driver's error in one line, unless this outage
        was said already."""
        if not self.down:
            self.down = True
            self.log.warning(
                _log.WORKER_DATABASE_ERROR, worker=self.worker_id, error=error_summary(error)
            )

    def recovered(self) -> None:
        """A round of statements went through: say the database answers again, once, when it
        was down."""
        if self.down:
            self.down = False
            self.log.info(_log.WORKER_DATABASE_RECOVERED, worker=self.worker_id)
