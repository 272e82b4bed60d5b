"""The Celery executor's beat tasks in this process, on a database and Celery's in-memory
broker: a distribution message takes the tick its beat sent it in, and a rescue that runs in a
process not yet allowed to judge other workers gone sends itself on."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import event

from outbox import Batch, Outbox
from outbox._db import queries
from outbox._engine import distributor
from outbox.executors.celery import (
    RESCUE_HOPS,
    RESCUE_TASK,
    SENT_AT_HEADER,
    CeleryExecutor,
    install,
)
from tests.conftest import reset_schema
from tests.models import ActivityEvent

# A minute: a test's few statements never straddle more than one tick's end.
EVERY = 60.0
QUEUE = "outbox-ticks"


@pytest.fixture
def executor(sqlite_url: str, make_app: Callable[..., Outbox]) -> Iterator[CeleryExecutor]:
    """outbox installed on a Celery application with an in-memory broker, on a fresh
    database; the worker process it registers in this process leaves the fleet after."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)

    @app.handler(ActivityEvent)
    def record(batch: Batch[ActivityEvent]) -> None:
        """Nothing."""

    celery = Celery("shop", broker="memory://", set_as_current=False)
    installed = install(celery, app, queue=QUEUE, distribute_every=EVERY)
    yield installed
    installed._stop_here(give_back=True)


def _taken(executor: CeleryExecutor) -> int | None:
    with executor.outbox.engine.connect() as conn:
        return queries.distributed_ticks(conn)["record"]


def _messages(executor: CeleryExecutor) -> list[tuple[str, dict[str, Any]]]:
    """Each message waiting on outbox's queue: its task and keyword arguments."""
    found = []
    with executor.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(QUEUE)
        while queue.qsize():
            message = queue.get(timeout=1)
            found.append((message.headers["task"], message.decode()[1]))
            message.ack()
    return found


def test_a_distribution_message_carries_when_it_was_sent(executor: CeleryExecutor) -> None:
    """The message a beat sends names the moment it was sent, by the sender's clock."""
    before = time.time()
    executor.distribute.apply_async(queue=QUEUE)
    after = time.time()
    with executor.celery.connection_for_read() as conn:
        message = conn.SimpleQueue(QUEUE).get(timeout=1)
    assert before <= message.headers[SENT_AT_HEADER] <= after


def test_a_distribution_message_run_after_its_tick_takes_its_own_tick(
    executor: CeleryExecutor,
) -> None:
    """A message sent in the tick before the database's takes that tick, not the current one."""
    sent = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=EVERY)
    executor.distribute.apply(headers={SENT_AT_HEADER: sent.timestamp()})
    assert distributor.tick_of(sent, EVERY) == _taken(executor)


def test_a_distribution_message_naming_a_tick_far_off_takes_the_databases(
    executor: CeleryExecutor,
) -> None:
    """A message whose sender's clock is an hour ahead takes the tick of the database's clock."""
    sent = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    before = distributor.database_tick(executor.outbox, EVERY)
    executor.distribute.apply(headers={SENT_AT_HEADER: sent.timestamp()})
    after = distributor.database_tick(executor.outbox, EVERY)
    assert _taken(executor) in {before, after}


def test_a_distribution_message_without_a_stamp_takes_the_databases_tick(
    executor: CeleryExecutor,
) -> None:
    """A message from an older sender, with no header: the tick the database's clock is in."""
    before = distributor.database_tick(executor.outbox, EVERY)
    executor.distribute.apply()
    after = distributor.database_tick(executor.outbox, EVERY)
    assert _taken(executor) in {before, after}


def test_the_other_messages_of_a_tick_it_took_cost_the_process_no_statement(
    executor: CeleryExecutor,
) -> None:
    """Once a process took a tick, another message naming it runs no statement there."""
    sent = time.time()
    executor.distribute.apply(headers={SENT_AT_HEADER: sent})
    statements: list[str] = []
    event.listen(
        executor.outbox.engine, "before_cursor_execute", lambda *a: statements.append(a[2])
    )
    executor.distribute.apply(headers={SENT_AT_HEADER: sent + 0.001})
    assert [] == statements


def test_a_rescue_in_a_process_not_yet_allowed_to_judge_sends_itself_on(
    executor: CeleryExecutor,
) -> None:
    """A process whose heartbeats are not yet steady for the stale age sends the rescue on, at
    once, for another process to judge."""
    executor.rescue.apply()
    assert [(RESCUE_TASK, {"hops": 1})] == _messages(executor)


def test_a_rescue_sent_on_its_last_hop_is_not_sent_again(executor: CeleryExecutor) -> None:
    """A rescue already sent on ``RESCUE_HOPS`` times stops there: the next beat's rescue comes."""
    executor.rescue.apply(kwargs={"hops": RESCUE_HOPS})
    assert [] == _messages(executor)
