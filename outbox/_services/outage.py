"""What a worker says and does while the database does not answer: one line when an outage
begins, not one per statement that fails (a worker retries many times a second), one when the
database answers again, and a back-off that ends once it does.

The worker, an executor's process and ``outbox.testing.drain`` each keep one, with their worker
id.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._db import check_connection
from outbox._db.dialects import error_summary
from outbox.exceptions import DatabaseUnavailableError

PROBE_SECONDS = 1.0
"""While a worker backs off after a database error, how often it tries a connection: a
database it could not reach that answers again ends the wait, rather than a wait grown to
half a minute and more holding its work back."""


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

    def back_off(self, engine: Engine, seconds: float, stopping: threading.Event) -> None:
        """Wait ``seconds`` after a database error, or until ``stopping`` is set, or until the
        database, once it could not be reached, answers again.

        A database that answers from the start failed the statement itself (a lock timeout,
        a full disk): the whole wait is kept, so that such errors are retried ever more slowly.
        """
        deadline = time.monotonic() + seconds
        reached = None
        while not stopping.wait(min(PROBE_SECONDS, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return
            if reached:
                continue
            try:
                check_connection(engine)
            except DatabaseUnavailableError:
                reached = False
                continue
            if reached is False:  # it came back
                return
            reached = True
