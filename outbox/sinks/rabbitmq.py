"""RabbitMQ: each event of a group published as one message, with publisher confirms and
``mandatory``, through pika on the worker's event loop
(``pip install 'sqlalchemy-outbox[rabbitmq]'``).

A group is published pipelined on one channel: every message is written in id order, then the
confirms are awaited together, so that a group of 1,000 costs one wait for the broker, not
1,000 (:mod:`outbox.sinks._amqp` matches the broker's answers to the messages). One channel
keeps publish order into each queue, so a queue holds a key's events in id order (outbox sends
one group of an ordering key at a time). A message is done only once the broker confirmed it;
one it nacked, returned as unroutable or did not confirm in time is retried alone. The
guarantee is at least once: RabbitMQ keeps no de-duplication window, so a message whose
confirm was lost (a worker killed, a connection cut) is published again with the same
``message_id``, which consumers de-duplicate by.

    from outbox.sinks.rabbitmq import AsyncRabbitMQSink, RabbitMQSink

    orders = RabbitMQSink("amqp://app:secret@rabbit:5672/", exchange="orders",
                          routing_key=lambda e: f"orders.{e.region}")
    app.handler(OrderEvent, batch_size=1000, ordering_key="customer_id")(orders)

See docs/sinks/rabbitmq.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import pika
import pika.exceptions

from outbox.app import Handler, Outbox
from outbox.batch import Batch
from outbox.exceptions import ConfigurationError, DownstreamError
from outbox.sinks._amqp import PENDING, ConfirmChannel, Lost, Message, Returned, cause
from outbox.sinks.base import AsyncSink, Rejection, blocking_sink
from outbox.sinks.encoding import (
    RowPath,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    row_messages,
)
from outbox.sinks.errors import downstream_failed, not_a_message, unavailable
from outbox.sinks.options import PerEvent, check_per_event, per_event
from outbox.sinks.secrets import Secrets, describe_error

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
        check_per_event("routing_key", routing_key)
        self.url = url
        self.exchange = exchange
        self.routing_key = routing_key
        self.payload = payload
        self.message_id = message_id
        self.headers = headers
        self.key = key
        self.content_type = content_type
        self.delivery_mode = 2 if persistent else 1
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self._secrets = Secrets()
        self._secrets.add_quoted(parts.password)
        vhost = parts.path if parts.path not in ("", "/") else "/"
        port = parts.port or _SCHEMES[parts.scheme]
        self._downstream = f"RabbitMQ at {parts.scheme}://{parts.hostname}:{port}{vhost}"
        # The key function of each handler the sink is registered as, by handler name.
        self._keys: dict[str, Callable[[Any], str | None] | None] = {}
        # How each handler's default messages are read from its rows, where they can be.
        self._row_paths: dict[str, RowPath | None] = {}
        try:
            self._parameters = pika.URLParameters(url)
        except Exception as error:
            raise ConfigurationError(
                f"url: {describe_error(error, Secrets([parts.password]))}"
            ) from None
        self._channel: ConfirmChannel | None = None
        self._stale: ConfirmChannel | None = None
        self._opening: asyncio.Lock | None = None

    @property
    def downstream(self) -> str:
        """``RabbitMQ at amqp://host:5672/``: the broker, without credentials."""
        return self._downstream

    @property
    def secrets(self) -> Secrets:
        """What the sink masks out of every error: the URL's password."""
        return self._secrets

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
            raise unavailable(self.downstream, cause(error), self._secrets) from error

    async def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """Learn the handler's ordering key, the ``outbox-key`` header's default, and whether
        its groups' messages can be read from their rows."""
        self._keys[handler.name] = self.key if self.key is not None else ordering_key(handler)
        # A routing key or headers function is given the event: no row path for it.
        self._row_paths[handler.name] = (
            row_messages(handler, payload=self.payload, message_id=self.message_id, key=self.key)
            if isinstance(self.routing_key, str) and self.headers is None
            else None
        )

    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Publish the group pipelined; the events the broker did not confirm, as rejections.

        Raises :class:`outbox.DownstreamError` when the connection is lost (or cannot be
        opened again) before the broker confirmed any of the group.
        """
        if not len(batch):
            return []
        messages = self._messages(batch)
        channel = await self._ready()
        try:
            # Every message is written before anything else runs on the loop: the group goes
            # out in id order, on one channel, with no other group's messages between.
            group = channel.publish(self.exchange, messages, len(messages))
        except Exception as error:
            self._stale = channel
            raise downstream_failed(self.downstream, cause(error), self._secrets) from error
        # Cancelled (a worker stopping): what was written is confirmed to no one, and sent
        # again with the group.
        await channel.wait(group, self.confirm_timeout)

        rejections: list[Rejection[Any]] = []
        lost: BaseException | None = None
        late = False
        confirmed = 0
        for index, ((routing_key, _, _), outcome) in enumerate(
            zip(messages, group.outcomes, strict=True)
        ):
            if outcome is None:
                confirmed += 1
                continue
            if outcome is PENDING:
                late = True
                reason = f"no confirm from RabbitMQ within {self.confirm_timeout:g} s"
            elif isinstance(outcome, Returned):
                reason = self._unroutable(routing_key, outcome.reply_text)
            elif isinstance(outcome, Lost):
                lost = lost or outcome.error
                reason = self._lost(outcome.error)
            else:
                reason = "nacked by RabbitMQ (a queue refused it, or the broker failed to store it)"
            rejections.append(Rejection(batch.events[index], reason))
        if lost is not None or late:
            # A connection that lost messages or confirms is not trusted with the next group.
            self._stale = channel
        if lost is not None and confirmed == 0:
            raise DownstreamError(f"{self.downstream}: {self._lost(lost)}") from lost
        return rejections

    async def close(self) -> None:
        """Close the connection."""
        channel, self._channel = self._channel, None
        self._stale = None
        if channel is not None:
            await channel.close()

    def _messages(self, batch: Batch[Any]) -> list[Message]:
        """The group's messages, in id order: read from its rows where they can be."""
        path = self._row_paths.get(batch.handler)
        rows = batch.rows
        if path is not None and rows and hasattr(rows[0], "_fields"):
            return [self._row_message(path, row) for row in rows]
        key = self._keys.get(batch.handler, self.key)
        return [self._message(event, key) for event in batch.events]

    def _row_message(self, path: RowPath, row: Any) -> Message:
        try:
            message_id, key, body = path.fields(row)
        except Exception as error:
            raise not_a_message(row[path.id_at], error, self._secrets) from error
        properties = self._properties(message_id, {} if key is None else {KEY_HEADER: key})
        # The routing key is a constant here: a function of the event is given the event.
        return str(self.routing_key), body, properties

    def _message(self, event: Any, key: Callable[[Any], str | None] | None) -> Message:
        try:
            headers: dict[str, Any] = {} if self.headers is None else dict(self.headers(event))
            value = None if key is None else key(event)
            if value is not None:
                headers[KEY_HEADER] = value
            properties = self._properties(self.message_id(event), headers)
            body = payload_bytes(self.payload(event))
            routing_key = per_event(self.routing_key, event)
        except Exception as error:
            # The event cannot be made a message: its data, not the broker, is at fault.
            raise not_a_message(getattr(event, "id", "?"), error, self._secrets) from error
        return routing_key, body, properties

    def _properties(self, message_id: str, headers: dict[str, Any]) -> pika.BasicProperties:
        # pika annotates every method but this constructor.
        return pika.BasicProperties(  # type: ignore[no-untyped-call]
            content_type=self.content_type,
            headers=headers,
            delivery_mode=self.delivery_mode,
            message_id=message_id,
        )

    def _unroutable(self, routing_key: str, reply_text: str) -> str:
        exchange = f"exchange {self.exchange!r}" if self.exchange else "the default exchange"
        return (
            f"unroutable ({reply_text}): no queue bound for routing key {routing_key!r} on "
            f"{exchange}"
        )

    def _describe(self, error: BaseException) -> str:
        return describe_error(cause(error), self._secrets)

    def _lost(self, error: BaseException) -> str:
        """Why a message in flight was lost with its channel."""
        if isinstance(error, _CLOSED_HERE):
            # The sink closed it: the worker stopping, or a connection that had lost a
            # message or a confirm replaced by a new one.
            return "the connection was closed before RabbitMQ confirmed the message"
        return self._describe(error)

    async def _ready(self) -> ConfirmChannel:
        """The channel to publish on, opened again after a loss."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            channel = self._channel
            if channel is not None and channel is not self._stale and channel.error is None:
                return channel
            await self.close()
            try:
                return await self._open()
            except Exception as error:
                raise downstream_failed(self.downstream, cause(error), self._secrets) from error

    async def _open(self) -> ConfirmChannel:
        try:
            async with asyncio.timeout(self.connect_timeout):
                channel = await ConfirmChannel.open(self._parameters, self.exchange)
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code != _NOT_FOUND:
                raise
            raise ConfigurationError(
                f"{self.downstream}: no exchange {self.exchange!r} (declare it first, or name "
                f'one that exists; "" is the default exchange)'
            ) from None
        self._channel = channel
        return channel


_CLOSED_HERE = (pika.exceptions.ConnectionClosedByClient, pika.exceptions.ChannelClosedByClient)
_NOT_FOUND = 404
"""The reply code of a passive declare of an exchange that does not exist."""


RabbitMQSink = blocking_sink(AsyncRabbitMQSink)
"""The sync face of :class:`AsyncRabbitMQSink`: the same arguments, a sync handler."""
