"""The executors the conformance suite runs on, each behind one small protocol.

An executor is a way of running outbox's jobs: ``native`` (outbox's own ``Worker``, as ``outbox
work`` runs it), ``inline`` (``outbox.testing.inline``, in the test's own process as the
writing transaction commits) and ``celery`` (``outbox.executors.celery`` on a Celery worker
started in this process, on the Redis broker; real worker processes are the Celery tests').
A harness starts the executor for an application, writes events as the application would, and
runs what is due until nothing due is left; the suite asserts on the database alone, so that
the same test holds every executor to the same behaviour.

A harness for an executor that runs jobs elsewhere (Celery's workers on a broker) starts its
workers in :meth:`Executor.start`; :meth:`Executor.run_due` distributes, sends a message for
every job due now (as a native worker's poll finds them all), waits until every message due by
now has been handled and no job is leased (:func:`leased`), and goes again while distribution
finds new work (an ordering key's next group, as the beat's next tick would).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from outbox import Outbox, schema
from outbox._db import queries
from outbox._engine import distributor
from outbox.ops import flow
from outbox.schema import db_now
from outbox.testing import Inline, inline
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import _unavailable as unavailable

ELSEWHERE = "a-worker-elsewhere:1:0000"
"""The worker id of the leases a test makes itself: another worker, alive, that holds them."""
NATIVE_CONCURRENCY = 2
"""Threads of the native worker: more than one, so that leases and caps are put to the test."""


class Executor(Protocol):
    """What the conformance suite asks of a way of running jobs."""

    name: str

    def start(self, app: Outbox) -> None:
        """Make ready to run the jobs of ``app``'s handlers (registered by now)."""

    def write(self, app: Outbox, model: type[Any], rows: Iterable[Mapping[str, Any]]) -> None:
        """Commit events in one transaction of a ``Session``, as the application writes them;
        an executor may run them as the commit ends (inline does)."""

    def run_due(self) -> None:
        """Run what is due now, through this executor; return once nothing due is left (a
        retry scheduled for later, or a turn of a rate limit, is not due now)."""

    def stop(self) -> None:
        """Stop what :meth:`start` started; idempotent."""


def commit_events(app: Outbox, model: type[Any], rows: Iterable[Mapping[str, Any]]) -> None:
    """Write events with the ORM in one committed transaction."""
    with Session(app.engine) as session:
        session.add_all(model(**row) for row in rows)
        session.commit()


def idle(app: Outbox) -> bool:
    """No job is due now unleased (but a paused handler's), and none is leased but to the
    test's other worker (``ELSEWHERE``): a round is over."""
    jobs = schema.jobs
    paused = list(flow.paused(app))
    due = and_(
        jobs.c.lease_token.is_(None), jobs.c.run_at <= db_now(), jobs.c.handler.not_in(paused)
    )
    with app.engine.connect() as conn:
        waiting = conn.execute(select(func.count()).where(or_(due, _held(jobs)))).scalar_one()
    return waiting == 0


def leased(app: Outbox) -> bool:
    """Whether a job is leased but to the test's other worker (``ELSEWHERE``): one runs."""
    with app.engine.connect() as conn:
        return bool(conn.execute(select(func.count()).where(_held(schema.jobs))).scalar_one())


def _held(jobs: Any) -> Any:
    return and_(jobs.c.lease_token.is_not(None), jobs.c.lease_owner != ELSEWHERE)


class NativeExecutor:
    """outbox's own worker, in burst mode: it distributes, claims and runs until idle."""

    name = "native"

    def __init__(self) -> None:
        self.app: Outbox | None = None

    def start(self, app: Outbox) -> None:
        self.app = app

    def write(self, app: Outbox, model: type[Any], rows: Iterable[Mapping[str, Any]]) -> None:
        commit_events(app, model, rows)

    def run_due(self) -> None:
        assert self.app is not None, "start the executor first"
        Worker(self.app, concurrency=NATIVE_CONCURRENCY, burst=True).run()

    def stop(self) -> None:
        self.app = None


class InlineExecutor:
    """``outbox.testing.inline``: a commit that wrote events runs them before it returns.
    Failures are read from the database here, as for the other executors, not raised."""

    name = "inline"

    def __init__(self) -> None:
        self.runner: Inline | None = None

    def start(self, app: Outbox) -> None:
        self.runner = inline(app, raise_errors=False).__enter__()

    def write(self, app: Outbox, model: type[Any], rows: Iterable[Mapping[str, Any]]) -> None:
        commit_events(app, model, rows)

    def run_due(self) -> None:
        assert self.runner is not None, "start the executor first"
        self.runner.drain()

    def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.__exit__(None, None, None)


CELERY_BROKER_ENV = "OUTBOX_TEST_CELERY_BROKER_URL"
DEFAULT_CELERY_BROKER_URL = "redis://127.0.0.1:6379/11"
CELERY_CONCURRENCY = 2
DUE_WITHIN_SECONDS = 1.0
"""A message with a countdown due within this long is waited for by :meth:`run_due` (a retry
due at once, a group handed back for its turn in a moment); one due later (a 6 s backoff, a
rate limit's next minute) is left for later, as the other executors leave it."""
SWEEP_LIMIT = 1000


class CeleryExecutor:
    """``outbox.executors.celery`` installed on a Celery application of its own, on a queue of
    its own, with a Celery worker (threads pool) started in this process."""

    name = "celery"

    def __init__(self) -> None:
        self.app: Outbox | None = None
        self.installed: Any = None
        self._worker: AbstractContextManager[Any] | None = None
        self._controller: Any = None
        self._queue = f"outbox-conformance-{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._pending: dict[str, float] = {}
        """Messages sent to this queue and not yet handled: task id -> when due (monotonic)."""

    def start(self, app: Outbox) -> None:
        from celery import Celery, signals
        from celery.contrib.testing.worker import start_worker

        from outbox.executors.celery import install

        broker = os.environ.get(CELERY_BROKER_ENV, DEFAULT_CELERY_BROKER_URL)
        celery = Celery(f"conformance-{self._queue}", broker=broker)
        try:
            with celery.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1)
        except Exception as error:
            unavailable(f"the Celery broker at {broker}", error)
        celery.conf.update(
            broker_connection_retry_on_startup=False, worker_hijack_root_logger=False
        )
        self.app = app
        self.installed = install(celery, app, queue=self._queue, distribute_every=0.1)
        signals.before_task_publish.connect(self._published, weak=False)
        signals.task_postrun.connect(self._handled, weak=False)
        self._worker = start_worker(
            celery,
            concurrency=CELERY_CONCURRENCY,
            pool="threads",
            loglevel="WARNING",
            perform_ping_check=False,
            queues=[self._queue],
        )
        self._controller = self._worker.__enter__()

    def _published(self, sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        if kwargs.get("routing_key") != self._queue or not isinstance(headers, dict):
            return
        countdown = 0.0
        eta = headers.get("eta")
        if eta:
            from datetime import UTC, datetime

            countdown = (datetime.fromisoformat(eta) - datetime.now(UTC)).total_seconds()
        with self._lock:
            self._pending[headers["id"]] = time.monotonic() + max(countdown, 0.0)

    def _handled(self, task_id: str | None = None, **_: Any) -> None:
        with self._lock:
            self._pending.pop(task_id or "", None)

    def _due_messages(self) -> int:
        soon = time.monotonic() + DUE_WITHIN_SECONDS
        with self._lock:
            return sum(1 for due in self._pending.values() if due <= soon)

    def write(self, app: Outbox, model: type[Any], rows: Iterable[Mapping[str, Any]]) -> None:
        commit_events(app, model, rows)

    def run_due(self) -> None:
        """Rounds, as the beat's ticks and the sweep would run them, until one distributes
        nothing new: a message for every job due now, then a wait for those messages and the
        ones they lead to (a retry due at once, the next group of a capped handler)."""
        assert self.app is not None, "start the executor first"
        app, installed = self.app, self.installed
        names = list(app.handlers)
        more = True
        while more:
            more = bool(distributor.enqueued(distributor.run_once(app, names)))
            with app.engine.connect() as conn:
                due = queries.overdue_jobs(conn, names, overdue_seconds=0.0, limit=SWEEP_LIMIT)
            installed.publish_all(due)
            wait_for(
                lambda: self._due_messages() == 0 and not leased(app),
                "the Celery worker to handle every message due",
            )

    def stop(self) -> None:
        from celery import signals

        worker, self._worker = self._worker, None
        if worker is not None:
            from celery.worker import state

            # What the test worker's exit does first, then a message (for no job: a no-op)
            # that wakes its event loop now rather than at its next second's poll.
            state.should_terminate = 0
            self.installed.publish(0)
            worker.__exit__(None, None, None)
            # A worker process sends this as it exits (the executor then leaves the fleet);
            # the test worker, a thread, does not.
            signals.worker_shutdown.send(sender=self._controller)
            signals.before_task_publish.disconnect(self._published)
            signals.task_postrun.disconnect(self._handled)
        self.app = None


EXECUTORS: dict[str, type[Executor]] = {
    "native": NativeExecutor,
    "inline": InlineExecutor,
    "celery": CeleryExecutor,
}
