"""The executors the conformance suite runs on, each behind one small protocol.

An executor is a way of running outbox's jobs: ``native`` (outbox's own ``Worker``, as ``outbox
work`` runs it) and ``inline`` (``outbox.testing.inline``, in the test's own process as the
writing transaction commits). A harness starts the executor for an application, writes events
as the application would, and runs what is due until nothing due is left; the suite asserts on
the database alone, so that the same test holds every executor to the same behaviour.

A harness for an executor that runs jobs elsewhere (Celery's workers on a broker) starts its
workers in :meth:`Executor.start`, and in :meth:`Executor.run_due` runs a distribution (its
claim jobs' messages then go out) and waits, polling the job table, until the round is over;
:func:`idle` is that wait's condition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from outbox import Outbox, schema
from outbox._db.dialects import db_now
from outbox.testing import Inline, inline
from outbox.worker import Worker

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
    """No job is due now unleased, and none is leased but to the test's other worker
    (``ELSEWHERE``): a round of an executor that runs jobs elsewhere is over."""
    jobs = schema.jobs
    due = and_(jobs.c.lease_token.is_(None), jobs.c.run_at <= db_now())
    mine = and_(jobs.c.lease_token.is_not(None), jobs.c.lease_owner != ELSEWHERE)
    with app.engine.connect() as conn:
        waiting = conn.execute(select(func.count()).where(or_(due, mine))).scalar_one()
    return waiting == 0


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


EXECUTORS: dict[str, type[Executor]] = {"native": NativeExecutor, "inline": InlineExecutor}
