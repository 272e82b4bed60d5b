"""The public API as an application uses it; `mypy --strict` must accept this file as is."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import (
    Batch,
    BufferMixin,
    ConfigurationError,
    Outbox,
    OutboxError,
    RetryPolicy,
    RunResult,
    Settings,
    Urgency,
    add_events,
    add_events_async,
    distribute_once,
    run_once,
)
from outbox.inbox import Inbox, prune, prune_async
from outbox.inbox.nats import JetStreamConsumer
from outbox.inbox.rabbitmq import ConsumeResult, Message, RabbitMQConsumer
from outbox.inbox.redis import RedisStreamConsumer
from outbox.once import Stopped
from outbox.ops import archive
from outbox.ops.metrics import HandlerStatus, collect
from outbox.ops.progress import Progress, StoppedError
from outbox.ops.scaling import Scaling, read_scaling
from outbox.results import BatchResult
from outbox.sinks import Rejection
from outbox.sinks.http import AsyncBulkHTTPSink, BulkHTTPSink, ErrorsById, StatusList
from outbox.sinks.nats import AsyncJetStreamSink, JetStreamSink
from outbox.sinks.rabbitmq import AsyncRabbitMQSink, RabbitMQSink
from outbox.sinks.redis import AsyncRedisStreamSink, RedisStreamSink
from outbox.testing import (
    DrainResult,
    HandlerFailedError,
    Inline,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    inline,
)
from outbox.worker import Worker


class Base(DeclarativeBase):
    pass


class ContactActivityEvent(BufferMixin, Base):
    __tablename__ = "typing_contact_activity_events"
    activity_id: Mapped[int]
    email: Mapped[str] = mapped_column(String(200))


app = Outbox("sqlite:///typing.sqlite3", settings=Settings(lease_seconds=30.0))
NIGHTLY = Urgency("NIGHTLY", priority=35, promise=43200.0)


@app.handler(
    ContactActivityEvent,
    batch_size=1000,
    urgency=Urgency.HOUR,
    retry=RetryPolicy(max_attempts=8),
    archive=False,
)
def sync_marketing(batch: Batch[ContactActivityEvent]) -> None:
    ids: list[int] = [e.activity_id for e in batch.events]
    key: tuple[uuid.UUID, int] = (batch.group_id, batch.attempt)
    bad = [e for e in batch.events if "@" not in e.email]
    batch.discard(bad, "no email address")
    batch.retry([e for e in batch.events if e.activity_id < 0], "rejected for now")
    del ids, key


class ContactEmailEvent(BufferMixin, Base):
    __tablename__ = "typing_contact_email_events"
    email: Mapped[str] = mapped_column(String(200))


@app.handler(ContactEmailEvent, batch_size=500, timeout=30.0)
async def push_emails(batch: Batch[ContactEmailEvent]) -> None:
    await asyncio.sleep(0)
    addresses: list[str] = [e.email for e in batch.events]
    batch.discard([e for e in batch.events if "@" not in e.email], "no email address")
    del addresses


def test_push_emails_directly(batch: Batch[ContactEmailEvent]) -> None:
    # The decorated function keeps its own type: still a coroutine function.
    asyncio.run(push_emails(batch))


def write(session: Session) -> int:
    session.add(ContactActivityEvent(activity_id=1, email="a@example.com"))
    return add_events(session, ContactActivityEvent, [{"activity_id": 2, "email": "b@x.org"}])


async def write_async(session: AsyncSession, conn: AsyncConnection) -> int:
    session.add(ContactActivityEvent(activity_id=3, email="c@example.com"))
    rows = [{"activity_id": 4, "email": "d@x.org"}]
    return await add_events_async(session, ContactActivityEvent, rows) + await add_events_async(
        conn, ContactActivityEvent, rows
    )


async_app = Outbox(engine=create_async_engine("postgresql+asyncpg://app@db/shop"))


def operate() -> None:
    result: DrainResult = drain(app)
    statuses: list[HandlerStatus] = collect(app)
    scaling: Scaling = read_scaling(app, target=0.5, apdex_window=86_400.0)
    replicas: int = scaling.workers_for(8)
    apdex: list[float | None] = [band.apdex for band in scaling.bands]
    worker = Worker(app, concurrency=4, burst=True)
    clean: bool = worker.run()
    delay: float = RetryPolicy().delay(3)
    try:
        app.get_handler("nope")
    except ConfigurationError as error:
        root: OutboxError = error
        del root
    del result, statuses, scaling, replicas, apdex, clean, delay


def test_with_inline(session: Session) -> None:
    # Handled as the commit ends; a handler's failure is raised at the block's end.
    with inline(app) as runner:
        write(session)
        session.commit()
        assert_not_enqueued(session, ContactActivityEvent)
        again: DrainResult = runner.drain()
        del again
    try:
        with inline(app, handlers=["sync_marketing"], raise_errors=True):
            write(session)
            session.commit()
    except HandlerFailedError as failed:
        results: tuple[BatchResult, ...] = failed.results
        del results
    quiet: Inline = inline(app, raise_errors=False)
    with quiet:
        write(session)
        session.commit()
    failures: list[BatchResult] = quiet.failures
    del failures


def test_enqueued(session: Session) -> None:
    write(session)
    assert_enqueued(session, ContactActivityEvent, count=2)
    assert_enqueued(app, "sync_marketing", where={"activity_id": 1})
    assert_enqueued(app.engine, app.get_handler("sync_marketing"))
    assert_not_enqueued(app, ContactActivityEvent, where=ContactActivityEvent.activity_id > 9)


async def test_enqueued_async(session: AsyncSession) -> None:
    await assert_enqueued(session, ContactActivityEvent, count=1)
    await assert_not_enqueued(session, ContactActivityEvent, where={"email": "x@example.com"})


class LoggedProgress(Progress):
    """How an application reports a long operation its own way, and stops it."""

    def __init__(self) -> None:
        self.done = 0

    def begin(self, verb: str, noun: str, total: int | None) -> None:
        print(verb, noun, total)

    def advance(self, done: int) -> None:
        self.done += done

    def should_stop(self) -> bool:
        return self.done >= 100_000


def prune_a_while() -> int:
    try:
        return archive.prune(app, older_than=30 * 86400.0, progress=LoggedProgress())
    except StoppedError as stopped:
        total: int | None = stopped.total
        del total
        return stopped.done


class OrderEvent(BufferMixin, Base):
    __tablename__ = "typing_order_events"
    region: Mapped[str] = mapped_column(String(20))
    customer: Mapped[str] = mapped_column(String(40))


class ShipmentEvent(BufferMixin, Base):
    __tablename__ = "typing_shipment_events"
    region: Mapped[str] = mapped_column(String(20))
    customer: Mapped[str] = mapped_column(String(40))


def order_body(events: Sequence[OrderEvent]) -> dict[str, object]:
    return {"orders": [{"customer": e.customer} for e in events]}


def refused(response: httpx.Response, events: Sequence[OrderEvent]) -> list[Rejection[Any]]:
    return [Rejection(e, "refused", retry=False) for e in events if not e.customer]


def sinks() -> None:
    # Each sink is a handler of any buffer model, sync or async, registered or called inside one.
    shop = Outbox("sqlite:///sinks.sqlite3")
    post = BulkHTTPSink("https://api.example.com/bulk", body=order_body, result=StatusList())
    shop.handler(OrderEvent, name="to_api", batch_size=500, bisect=True)(post)
    by_id = ErrorsById(items="errors", record_id=lambda e: e.customer)
    AsyncBulkHTTPSink("https://api.example.com/bulk", body=order_body, result=by_id)
    AsyncBulkHTTPSink("https://api.example.com/bulk", result=refused)
    RedisStreamSink("redis://cache:6379/0", stream=lambda e: f"orders.{e.region}", maxlen=1000)
    AsyncRedisStreamSink(stream="orders")
    RabbitMQSink(exchange="orders", routing_key=lambda e: e.region)
    rabbit = AsyncRabbitMQSink("amqp://guest:guest@mq:5672/", routing_key="orders")
    guarantee: str = rabbit.outbox_guarantee
    jetstream = AsyncJetStreamSink(
        "nats://nats:4222", subject=lambda e: f"orders.{e.region}", stream="ORDERS"
    )
    shop.handler(ShipmentEvent, name="to_nats", ordering_key="customer")(jetstream)
    JetStreamSink(subject="orders.all")
    del guarantee


def inbox_consumers() -> None:
    # A ready consumer per broker: a sync effect with a Session, or an async one with an
    # AsyncSession on an AsyncEngine (the JetStream consumer).
    orders_in: Inbox = app.inbox("orders-in", horizon=3600.0)

    def apply(session: Session, messages: list[Message]) -> None:
        session.add_all(ContactActivityEvent(activity_id=len(m.json())) for m in messages)

    async def apply_async(session: AsyncSession, messages: list[Message]) -> None:
        await session.run_sync(lambda sync: apply(sync, messages))

    rabbit = RabbitMQConsumer(app, orders_in, apply, queue="orders", max_deliveries=5)
    result: ConsumeResult = rabbit.consume(max_messages=100, timeout=1.0)
    redis_consumer = RedisStreamConsumer(
        app.engine, orders_in, apply, stream="orders", group="billing", claim_idle=60.0
    )
    redis_consumer.stop()
    total: ConsumeResult = redis_consumer.run(handle_signals=False) + result
    engine = create_async_engine("postgresql+asyncpg://app@db/shop")
    jetstream = JetStreamConsumer(engine, orders_in, apply_async, stream="ORDERS", durable="b")
    asyncio.run(jetstream.run())
    JetStreamConsumer(app, orders_in, apply, stream="ORDERS", durable="c").stop()
    deleted: int = prune(app.engine, chunks=10) + asyncio.run(prune_async(engine, chunks=1))
    del total, deleted


def scheduled_run(stop: threading.Event) -> bool:
    """A scheduler's task: run once on a minute's tick; True when someone should look."""
    result: RunResult = run_once(app, every=60.0, budget_seconds=50.0, max_groups=100, stop=stop)
    lost: list[str] = distribute_once(app, every=60.0).lost
    waiting: float | None = result.work.next_due_in
    slots: int = result.desired_workers
    bounded: bool = result.work.stopped in (Stopped.BUDGET, Stopped.MAX_GROUPS)
    return result.needs_operator or (bounded and bool(lost) and waiting == 0.0 and slots > 1)


def celery_executor() -> None:
    # outbox on the application's own Celery: one call, and what it returns.
    from celery import Celery

    from outbox.executors.celery import CeleryExecutor, install

    celery = Celery("shop", broker="memory://")
    executor: CeleryExecutor = install(
        celery, Outbox("sqlite://"), queue="outbox", distribute_every=1.0, rescue_every=5.0
    )
    sent: bool = executor.publish(42, countdown=1.5)
    del sent
