"""A worker's maintenance: one thread that heartbeats (extending the leases of the jobs the
worker runs, and learning whether it leads the fleet), writes its throughput, acts on what an
operator asked of it, watches the database's schema, rescues, takes back handlers whose
buffer tables exist again, and, while it leads, distributes and starts the archive's
retention passes (``Settings.archive_retention_days``).

The worker hands in what is its own: how to distribute, how to wake its loop, how to drain or
stop it, and its events for stopping and aborting. Each step is a method a test can call; the
loop only decides when each is due.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._core import log as _log
from outbox._db.dialects import is_transient
from outbox._services.distribution_watch import DistributionWatch
from outbox._services.heartbeat import Heartbeat, heartbeat_interval
from outbox._services.missing_tables import MissingTables
from outbox._services.outage import Outage
from outbox._services.rescuer import Rescuer
from outbox._services.retention import RETENTION_EVERY, Retention
from outbox._services.schema_watch import SchemaWatch
from outbox._services.throughput import Throughput
from outbox.app import Outbox
from outbox.exceptions import SchemaIncompatibleError


class Maintenance:
    """The maintenance of the worker ``worker_id``. ``log``: the worker's logger, which the
    lines keep. ``distribute``: distribute for these handlers, returning the claim jobs
    enqueued (None for ``distribute_every``: never, cron distributes). ``in_flight``: jobs the
    worker runs now. ``wake``: wake the worker's loop to look for work. ``drain`` and ``stop``:
    an operator's requests, and ``stop`` for a schema it may not work on."""

    def __init__(
        self,
        app: Outbox,
        worker_id: str,
        log: _log.Logger,
        *,
        heartbeat: Heartbeat,
        throughput: Throughput,
        outage: Outage,
        missing: MissingTables,
        distribute_every: float | None,
        distribute: Callable[[list[str]], int],
        in_flight: Callable[[], int],
        wake: Callable[[], None],
        drain: Callable[[], None],
        stop: Callable[[], None],
        stopping: threading.Event,
        aborted: threading.Event,
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.log = log
        self.heartbeat_service = heartbeat
        self.throughput = throughput
        self.outage = outage
        self.missing = missing
        self.distribute_every = distribute_every
        self.distribute = distribute
        self.in_flight = in_flight
        self.wake = wake
        self.drain = drain
        self.stop = stop
        self.stopping = stopping
        self.aborted = aborted
        self.rescuer = Rescuer(app, worker_id, judge_heartbeats=heartbeat.may_judge_others)
        self.distribution_watch = DistributionWatch(app, worker_id)
        self.schema_watch = SchemaWatch(app)
        self.retention = Retention(app)
        self.schema_suspect = threading.Event()
        """A statement failed in a way a schema change explains: look at the schema now."""
        self.schema_incompatible: SchemaIncompatibleError | None = None
        """Why the worker stopped on its own: the database's schema became one it may not
        work on; None otherwise."""
        self.asked: str | None = None
        """The operator's request the worker last acted on."""
        self.live_workers = 1
        """Live workers in the fleet, as of the last heartbeat."""
        self.leading = False
        """Whether the worker led the fleet at its last heartbeat (it distributes)."""

    def main(self) -> None:
        """The maintenance thread: each step at its time, until the worker aborts, or stops
        with nothing in flight."""
        settings = self.app.settings
        heartbeat_every = heartbeat_interval(settings)
        next_heartbeat = next_rescue = next_distribution = next_retention = time.monotonic()
        while not self.aborted.is_set():
            now = time.monotonic()
            heartbeat_due = now >= next_heartbeat
            if heartbeat_due:
                # Set before the steps run: one that fails waits for the next heartbeat
                # rather than running again at once, many times a second.
                next_heartbeat = now + heartbeat_every
            if heartbeat_due or self.schema_suspect.is_set():
                # First, and on its own: on a schema this worker may not work on, any of the
                # steps below may fail (a table or a column gone), and none may keep it from
                # finding out and stopping.
                self.watch_schema()
            try:
                if heartbeat_due:
                    self.heartbeat()
                    if self.schema_incompatible is None:
                        self.throughput.run_once()
                        self.read_request()
                if now >= next_rescue and not self.stopping.is_set():
                    self.rescuer.run_once()
                    if self.missing.run_once():
                        self.wake()
                    if self.distribute_every is None and self.leading:
                        # Distribution is left to cron: say so if nothing runs it.
                        self.distribution_watch.run_once(self.missing.serving)
                    next_rescue = now + settings.rescue_interval * (0.75 + random.random() / 2)
                if (
                    self.distribute_every is not None
                    and now >= next_distribution
                    and not self.stopping.is_set()
                ):
                    if self.leading and self.distribute(self.missing.serving):
                        # Its claim jobs are due now: start on them rather than at the next
                        # poll, seconds away in a fleet that is not notified (no LISTEN).
                        self.wake()
                    next_distribution = now + self.distribute_every
                if self.leading and now >= next_retention and not self.stopping.is_set():
                    # In a thread of its own: the heartbeat never waits for a pass.
                    self.retention.start()
                    next_retention = now + RETENTION_EVERY
            except DBAPIError as error:
                self.suspect_schema(error)
                if self.schema_suspect.is_set():
                    # A column or a table gone: a schema taken back under this worker says
                    # why in its own line, and the error it explains is not one to report.
                    self.watch_schema()
                if self.schema_incompatible is None:
                    self.outage.report(error)
            except Exception as error:
                self.log.exception(_log.WORKER_LOOP_ERROR, worker=self.worker_id, error=str(error))
            if self.stopping.is_set() and self.in_flight() == 0:
                return
            wait = min(next_heartbeat, next_rescue, next_distribution) - time.monotonic()
            if self.schema_suspect.is_set():
                wait = 0.0
            self.aborted.wait(min(max(wait, 0.05), 1.0))

    def heartbeat(self) -> None:
        """Heartbeat, and keep what it learned of the fleet."""
        beat = self.heartbeat_service.run_once()
        self.live_workers, self.leading = beat.live_workers, beat.leading

    def read_request(self) -> None:
        """Act on what an operator asked of the worker in its row: drain or stop; a request
        it does not know (of a newer outbox) is logged and left alone."""
        asked = self.heartbeat_service.asked()
        if asked is None or asked.request == self.asked:
            return
        self.asked = asked.request
        known = asked.request in set(schema.WorkerRequest)
        self.log.info(
            _log.WORKER_ASKED,
            worker=self.worker_id,
            request=asked.request,
            requested_by=asked.requested_by,
            in_flight=self.in_flight(),
            known=known,
        )
        if asked.request == schema.WorkerRequest.DRAIN:
            self.drain()
        elif asked.request == schema.WorkerRequest.STOP:
            self.stop()

    def watch_schema(self) -> None:
        """Stop the worker taking work once the database's schema is one it may not work on:
        what it holds finishes within the grace period, as on SIGTERM. Says why once."""
        self.schema_suspect.clear()
        if self.stopping.is_set():
            return
        problem = self.schema_watch.watch(self.worker_id, self.outage.report, self.log)
        if problem is None:
            return
        self.schema_incompatible = problem
        self.stop()

    def suspect_schema(self, error: DBAPIError) -> None:
        """A statement failed for good (not contention, not a dropped connection): a table or a
        column it names may be gone, the schema taken back or moved on under the worker. The
        maintenance thread looks at the schema now rather than at the next heartbeat."""
        if not is_transient(error):
            self.schema_suspect.set()
