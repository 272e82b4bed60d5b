"""RabbitMQ: each event of a group published as one message, with publisher confirms and
``mandatory``, through aio-pika (``pip install 'sqlalchemy-outbox[rabbitmq]'``).

A group is published pipelined on one channel: every message is written in id order, then the
confirms are awaited together, so that a group of 1,000 costs one wait for the broker, not
1,000. One channel keeps publish order into each queue, so a queue holds a key's events in id
order (outbox sends one group of an ordering key at a time). A message is done only once the
broker confirmed it; one it nacked, returned as unroutable or did not confirm in time is
retried alone. The guarantee is at least once: RabbitMQ keeps no de-duplication window, so a
message whose confirm was lost (a worker killed, a connection cut) is published again with
the same ``message_id``, which consumers de-duplicate by.

    from outbox.sinks.rabbitmq import AsyncRabbitMQSink, RabbitMQSink

    orders = RabbitMQSink("amqp://app:secret@rabbit:5672/", exchange="orders",
                          routing_key=lambda e: f"orders.{e.region}")
    app.handler(OrderEvent, batch_size=1000, ordering_key="customer_id")(orders)

See docs/sinks/rabbitmq.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
from yarl import URL

from outbox.app import Handler, Outbox
from outbox.batch import Batch
from outbox.exceptions import ConfigurationError, DataError, DownstreamError
from outbox.sinks.base import (
    AsyncSink,
    PerEvent,
    Rejection,
    Secrets,
    blocking_sink,
    describe_error,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    per_event,
    unavailable,
)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
CONFIRM_TIMEOUT_SECONDS = 10.0
"""How long a group waits for the broker's confirms once every message is written."""
CONNECT_TIMEOUT_SECONDS = 10.0
"""How long opening the connection, its channel and the exchange's check may take."""
KEY_HEADER = "outbox-key"
"""The header that carries each message's key (the handler's ordering key by default)."""

GUARANTEE = (
    "at least once: duplicates only for groups in flight at a kill or a lost confirm, each "
    "carrying the same message_id; consumers de-duplicate by message_id"
)

_SCHEMES = {"amqp": 5672, "amqps": 5671}


class AsyncRabbitMQSink(AsyncSink):
    """Publishes each event of a group to a RabbitMQ exchange, with publisher confirms.

    ``url``: the broker (``amqp://user:password@host:5672/vhost``; the password never shows in
    an error or a log). ``exchange``: where to publish; ``""`` is the default exchange, which
    routes by queue name; any other must exist (checked when the worker starts).
    ``routing_key``: the routing key, given once or as a function of the event (its columns),
    so that one buffer feeds many queues. ``payload``: the body, from the event: bytes as they
    are, text in UTF-8, anything else as JSON (default: the event's columns as JSON).
    ``message_id``: the message's ``message_id`` property, the same on every attempt (default
    ``<table>-<id>``): what consumers de-duplicate by. ``headers``: more headers, from the
    event. ``key``: the ``outbox-key`` header; by default the value of the handler's
    ``ordering_key`` column, learnt when the worker starts (no header without one).
    ``content_type``: the message's content type. ``persistent``: delivery mode 2, so that a
    durable queue keeps the message across a broker restart. ``confirm_timeout``: seconds a
    group waits for its confirms; a message not confirmed by then is retried.
    ``connect_timeout``: seconds connecting may take.

    Every message is published ``mandatory``: one that no queue is bound for is returned by the
    broker and retried (then dead-lettered with the reason, when the handler's attempts run
    out), never dropped in silence.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        exchange: str = "",
        routing_key: PerEvent[str],
        payload: Callable[[Any], bytes | str | Any] = json_payload,
        message_id: Callable[[Any], str] = message_id,
        headers: Callable[[Any], Mapping[str, Any]] | None = None,
        key: Callable[[Any], str | None] | None = None,
        content_type: str = "application/json",
        persistent: bool = True,
        confirm_timeout: float = CONFIRM_TIMEOUT_SECONDS,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__()
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            raise ConfigurationError(
                f"url: expected amqp://[user:password@]host[:port][/vhost] (or amqps://), "
                f"got a URL with scheme {parts.scheme!r}"
            )
        for name, seconds in (
            ("confirm_timeout", confirm_timeout),
            ("connect_timeout", connect_timeout),
        ):
            if not seconds > 0:
                raise ConfigurationError(f"{name}: expected seconds > 0, got {seconds!r}")
        if not (isinstance(routing_key, str) or callable(routing_key)):
            raise ConfigurationError(
                f"routing_key: expected a string or a function of the event, got "
                f"{type(routing_key).__name__}"
            )
        self.url = url
        self.exchange = exchange
        self.routing_key = routing_key
        self.payload = payload
        self.message_id = message_id
        self.headers = headers
        self.key = key
        self.content_type = content_type
        self.delivery_mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self._secrets = Secrets([parts.password, unquote(parts.password or "")])
        vhost = parts.path if parts.path not in ("", "/") else "/"
        port = parts.port or _SCHEMES[parts.scheme]
        self._downstream = f"RabbitMQ at {parts.scheme}://{parts.hostname}:{port}{vhost}"
        # The key function of each handler the sink is registered as, by handler name.
        self._keys: dict[str, Callable[[Any], str | None] | None] = {}
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None
        self._stale: aio_pika.abc.AbstractChannel | None = None
        self._opening: asyncio.Lock | None = None

    @property
    def downstream(self) -> str:
        """``RabbitMQ at amqp://host:5672/``: the broker, without credentials."""
        return self._downstream

    @property
    def outbox_guarantee(self) -> str:
        """At least once; consumers de-duplicate by ``message_id``."""
        return GUARANTEE

    async def connect(self) -> None:
        """Connect, open a confirm channel and check that the exchange exists.

        Raises :class:`outbox.DownstreamUnavailableError` (unreachable, credentials refused)
        or :class:`outbox.ConfigurationError` (no such exchange), one line each.
        """
        self._opening = asyncio.Lock()
        try:
            await self._open()
        except ConfigurationError:
            raise
        except Exception as error:
            raise unavailable(self.downstream, error, self._secrets) from error

    async def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """Learn the handler's ordering key, the ``outbox-key`` header's default."""
        self._keys[handler.name] = self.key if self.key is not None else ordering_key(handler)

    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Publish the group pipelined; the events the broker did not confirm, as rejections.

        Raises :class:`outbox.DownstreamError` when the connection is lost (or cannot be
        opened again) before the broker confirmed any of the group.
        """
        events = batch.events
        if not events:
            return []
        key = self._keys.get(batch.handler, self.key)
        routed = [self._message(event, key) for event in events]
        channel, exchange = await self._ready()
        # Tasks start in creation order and each writes its message before its first real
        # wait (aiormq's channel lock is FIFO): the messages go out in id order, one channel.
        publishing = [
            asyncio.ensure_future(exchange.publish(message, routing_key, mandatory=True))
            for message, routing_key in routed
        ]
        try:
            _, late = await asyncio.wait(publishing, timeout=self.confirm_timeout)
        finally:
            # Cancelled (a worker stopping) or timed out: no publish outlives the call.
            waiting = [task for task in publishing if not task.done()]
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)

        rejections: list[Rejection[Any]] = []
        lost: BaseException | None = None
        confirmed = 0
        for event, (_, routing_key), task in zip(events, routed, publishing, strict=True):
            if task in late:
                reason = f"no confirm from RabbitMQ within {self.confirm_timeout:g} s"
            elif task.cancelled():
                lost = lost or ConnectionError("the publish was cancelled by its channel closing")
                reason = "the channel closed before RabbitMQ confirmed the message"
            elif (error := task.exception()) is None:
                confirmed += 1
                continue
            elif isinstance(error, aio_pika.exceptions.PublishError):
                reason = self._unroutable(routing_key, error)
            elif isinstance(error, aio_pika.exceptions.DeliveryError):
                reason = "nacked by RabbitMQ (a queue refused it, or the broker failed to store it)"
            else:
                lost = lost or error
                reason = describe_error(error, self._secrets)
            rejections.append(Rejection(event, reason))
        if lost is not None or late:
            # A connection that lost messages or confirms is not trusted with the next group.
            self._stale = channel
        if lost is not None and confirmed == 0:
            raise DownstreamError(
                f"{self.downstream}: {describe_error(lost, self._secrets)}"
            ) from lost
        return rejections

    async def close(self) -> None:
        """Close the connection."""
        connection, self._connection = self._connection, None
        self._channel = self._exchange = self._stale = None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await connection.close()

    def _message(
        self, event: Any, key: Callable[[Any], str | None] | None
    ) -> tuple[aio_pika.Message, str]:
        try:
            headers: dict[str, Any] = {} if self.headers is None else dict(self.headers(event))
            value = None if key is None else key(event)
            if value is not None:
                headers[KEY_HEADER] = value
            message = aio_pika.Message(
                payload_bytes(self.payload(event)),
                message_id=self.message_id(event),
                headers=headers,
                content_type=self.content_type,
                delivery_mode=self.delivery_mode,
            )
            routing_key = per_event(self.routing_key, event)
        except Exception as error:
            # The event cannot be made a message: its data, not the broker, is at fault.
            raise DataError(
                f"event {getattr(event, 'id', '?')} cannot be made a message: "
                f"{describe_error(error, self._secrets)}"
            ) from error
        return message, routing_key

    def _unroutable(self, routing_key: str, error: aio_pika.exceptions.PublishError) -> str:
        exchange = f"exchange {self.exchange!r}" if self.exchange else "the default exchange"
        frame = getattr(error, "frame", None)
        code = getattr(frame, "reply_text", None) or "NO_ROUTE"
        return f"unroutable ({code}): no queue bound for routing key {routing_key!r} on {exchange}"

    async def _ready(self) -> tuple[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractExchange]:
        """The channel and exchange to publish on, opened again after a loss."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            channel, exchange, connection = self._channel, self._exchange, self._connection
            if (
                channel is not None
                and exchange is not None
                and connection is not None
                and channel is not self._stale
                and not channel.is_closed
                and not connection.is_closed
            ):
                return channel, exchange
            await self.close()
            try:
                return await self._open()
            except Exception as error:
                raise DownstreamError(
                    f"{self.downstream}: {describe_error(error, self._secrets)}"
                ) from error

    async def _open(
        self,
    ) -> tuple[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractExchange]:
        # Made here rather than by aio_pika.connect, so that one that fails is closed too
        # (aio-pika would leave it to the garbage collector, which warns).
        connection = aio_pika.Connection(URL(self.url))
        async with asyncio.timeout(self.connect_timeout):
            try:
                await connection.connect(timeout=self.connect_timeout)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                if self.exchange:
                    exchange = await self._existing_exchange(channel)
                else:
                    exchange = channel.default_exchange
            except BaseException:
                with contextlib.suppress(Exception):
                    await connection.close()
                raise
        self._connection, self._channel, self._exchange = connection, channel, exchange
        return channel, exchange

    async def _existing_exchange(
        self, channel: aio_pika.abc.AbstractChannel
    ) -> aio_pika.abc.AbstractExchange:
        try:
            return await channel.get_exchange(self.exchange, ensure=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            raise ConfigurationError(
                f"{self.downstream}: no exchange {self.exchange!r} (declare it first, or name "
                f'one that exists; "" is the default exchange)'
            ) from None


RabbitMQSink = blocking_sink(AsyncRabbitMQSink)
"""The sync face of :class:`AsyncRabbitMQSink`: the same arguments, a sync handler."""
