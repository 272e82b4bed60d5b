"""A ready consumer of a RabbitMQ queue into an inbox (pika, ``pip install
'sqlalchemy-outbox[rabbitmq]'``): each batch's new messages have their effect, and their
``message_id`` is recorded, in one transaction; the batch is acknowledged after the commit.

    from outbox.inbox.rabbitmq import RabbitMQConsumer

    orders_in = app.inbox("orders-in", sender="orders")

    def apply(session: Session, messages: list[Message]) -> None:
        session.add_all(Order(**m.json()) for m in messages)

    RabbitMQConsumer(app, orders_in, apply, queue="orders").run()

The consumer is sync, on pika's ``BlockingConnection``: its effect is a plain function called
with a ``Session``, as an application's sync SQLAlchemy code is (an async effect is refused
where it is given). See docs/inbox.md, "Ready consumers".
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import pika
import pika.adapters.blocking_connection
import pika.exceptions
import pika.spec
from sqlalchemy import Engine

from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox
from outbox.inbox._consumer import (
    BATCH_SIZE,
    FAILURE_PAUSE_SECONDS,
    MAX_DELIVERIES,
    PRUNE_CHUNKS,
    PRUNE_INTERVAL_SECONDS,
    ConsumeResult,
    Effect,
    Message,
    Verdict,
)
from outbox.inbox._loop import SyncConsumer, Taken
from outbox.inbox._settings import sync_engine

__all__ = ["ConsumeResult", "Message", "RabbitMQConsumer"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DELIVERY_COUNT_HEADER = "x-delivery-count"
"""The header a quorum queue sets on a message it delivers again: the earlier deliveries."""
_NOT_FOUND = 404
"""The reply code of a consume from a queue that does not exist."""
_POLL_SECONDS = 0.2
"""How long one wait for the broker's frames lasts: a stop is seen within it."""


class RabbitMQConsumer(SyncConsumer):
    """Consumes ``queue`` into ``inbox``: the effect of each batch's new messages and their ids
    in one transaction, then the acks.

    ``database``: the Outbox application (its engine) or an Engine. ``inbox``: from
    ``app.inbox(...)``. ``effect(session, messages)``: a sync function, called in the batch's
    transaction with the messages whose ``message_id`` the inbox did not hold (a
    :class:`Message` each: ``id``, ``body``, ``headers``, ``deliveries``); it must not commit.
    ``url``: the broker (``amqp://user:password@host:5672/vhost``). ``queue``: the queue to
    consume, which must exist. ``batch_size``: the prefetch, and the most messages one
    transaction applies.

    On failure: an effect that raises rolls the transaction back; the batch's messages are
    then applied one by one, each in its own transaction, so that only the failing one is
    given back (``basic.reject``, requeued) after ``failure_pause`` seconds, which the consumer
    waits out (RabbitMQ would deliver it again at once, and a poison message would spin). At its
    ``max_deliveries``-th delivery (a quorum queue's ``x-delivery-count``; on a classic queue,
    which counts nothing, the consumer counts the failures it saw itself) it is rejected
    without requeue: the queue's dead-letter exchange (``x-dead-letter-exchange``) receives
    it, or RabbitMQ drops it when the queue has none, and an error line names its id and
    error. A message without a ``message_id`` is rejected the same way at once. While the
    database cannot be reached, the batch is held unacknowledged and tried again after a
    growing pause; a lost broker connection is opened again after one (RabbitMQ redelivers
    what was not acknowledged, and the inbox makes each committed one a repeat).
    """

    kind = "RabbitMQ queue"
    broker_errors = (
        pika.exceptions.AMQPError,
        ConnectionError,
        OSError,
    )

    def __init__(
        self,
        database: Outbox | Engine,
        inbox: Inbox,
        effect: Effect,
        *,
        queue: str,
        url: str = DEFAULT_URL,
        batch_size: int = BATCH_SIZE,
        max_deliveries: int = MAX_DELIVERIES,
        failure_pause: float = FAILURE_PAUSE_SECONDS,
        prune_interval: float = PRUNE_INTERVAL_SECONDS,
        prune_chunks: int = PRUNE_CHUNKS,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise ConfigurationError(f"queue: expected a queue's name, got {queue!r}")
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ConfigurationError(
                f"url: expected amqp://[user:password@]host[:port][/vhost] (or amqps://), "
                f"got a URL with scheme {parts.scheme!r}"
            )
        super().__init__(
            sync_engine(database, f"RabbitMQ consumer of {queue!r}"),
            inbox,
            effect,
            source=queue,
            batch_size=batch_size,
            max_deliveries=max_deliveries,
            failure_pause=failure_pause,
            prune_interval=prune_interval,
            prune_chunks=prune_chunks,
        )
        self.queue = queue
        self.url = url
        self._parameters = pika.URLParameters(url)
        self._connection: pika.BlockingConnection | None = None
        self._channel: pika.adapters.blocking_connection.BlockingChannel | None = None
        self._delivered: list[Taken] = []
        self._cancelled = False

    def _open(self) -> None:
        self._delivered = []
        self._cancelled = False
        connection = pika.BlockingConnection(self._parameters)
        try:
            channel = connection.channel()
            # The prefetch bounds what the broker pushes ahead of the acks: one batch.
            channel.basic_qos(prefetch_count=self.batch_size)
            channel.basic_consume(self.queue, on_message_callback=self._on_message)
            # The broker cancels the consumer when its queue is deleted (or re-declared, or
            # its node fails over): taken as a lost connection, opened again.
            channel.add_on_cancel_callback(self._on_cancel)
        except pika.exceptions.ChannelClosedByBroker as error:
            if connection.is_open:
                connection.close()
            if error.reply_code != _NOT_FOUND:
                raise
            # A name to correct, not an outage to wait out.
            raise ConfigurationError(
                f"{self.name}: RabbitMQ has no queue {self.queue!r} (declare it first)"
            ) from None
        except BaseException:
            if connection.is_open:
                connection.close()
            raise
        self._connection, self._channel = connection, channel

    def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._delivered = []
        if connection is not None and connection.is_open:
            connection.close()

    def _on_message(
        self,
        channel: pika.adapters.blocking_connection.BlockingChannel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        headers = dict(properties.headers or {})
        earlier = headers.get(DELIVERY_COUNT_HEADER)
        if isinstance(earlier, int) and not isinstance(earlier, bool):
            deliveries = earlier + 1
        else:
            deliveries = 2 if method.redelivered else 1
        message_id = properties.message_id
        message = Message(
            id=message_id if isinstance(message_id, str) else "",
            body=body,
            headers=headers,
            deliveries=deliveries,
            source=self.queue,
            broker_id=str(method.delivery_tag),
        )
        self._delivered.append((message, method.delivery_tag))

    def _on_cancel(self, frame: object) -> None:
        self._cancelled = True

    def _take(self, limit: int, wait: float) -> list[Taken]:
        connection = self._connection
        assert connection is not None
        waited = 0.0
        while not self._delivered and waited < wait and not self._stopping.is_set():
            step = min(_POLL_SECONDS, wait - waited)
            connection.process_data_events(time_limit=step)
            waited += step
            if self._cancelled:
                raise pika.exceptions.ConsumerCancelled(
                    f"RabbitMQ cancelled the consumer of queue {self.queue!r}"
                )
        if self._delivered:
            # What else the broker has pushed already joins the batch.
            connection.process_data_events(time_limit=0)
        taken, self._delivered = self._delivered[:limit], self._delivered[limit:]
        return taken

    def _settle(
        self, taken: Sequence[Taken], verdicts: Sequence[Verdict], errors: Sequence[str]
    ) -> None:
        channel = self._channel
        assert channel is not None
        for (_, tag), verdict in zip(taken, verdicts, strict=True):
            if verdict is Verdict.ACK:
                channel.basic_ack(tag)
            elif verdict is Verdict.DEAD:
                channel.basic_reject(tag, requeue=False)
            elif verdict is Verdict.RETRY:
                # basic.reject says the processing failed: RabbitMQ 4.3 counts it in a quorum
                # queue's delivery count (and against its delivery-limit)...
                channel.basic_reject(tag, requeue=True)
            else:
                # ...basic.nack that it was not processed: a held batch given back is no
                # failure of its messages, and 4.3 does not count it.
                channel.basic_nack(tag, requeue=True)

    def _sleep(self, seconds: float) -> bool:
        # pika's blocking connection answers heartbeats only while it processes events.
        connection = self._connection
        if connection is None or not connection.is_open:
            return super()._sleep(seconds)
        waited = 0.0
        while waited < seconds and not self._stopping.is_set():
            step = min(_POLL_SECONDS, seconds - waited)
            try:
                connection.sleep(step)
            except self.broker_errors:
                return super()._sleep(seconds - waited)
            waited += step
        return self._stopping.is_set()
