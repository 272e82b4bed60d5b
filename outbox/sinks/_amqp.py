"""A RabbitMQ confirm channel on pika's asyncio adapter: the publishing core of the RabbitMQ sink.

pika marshals a message's frames in plain Python and appends them to a buffer that the event
loop flushes when the socket is writable, so that a group of 1,000 messages costs no task, lock
or future per message and goes out in a few socket writes, not 1,000 (about 35 µs of CPU per
message where aio-pika spends 300: ``benchmarks/amqp_clients.py``).

The channel keeps, for every message in flight, the group it belongs to and its place there,
and settles it from the broker's answers: ``basic.ack`` or ``basic.nack`` (one message, or
every one up to a delivery tag), ``basic.return`` (sent before the ack of the same message), or
the channel or the connection closing, which settles every message still in flight as lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import pika
import pika.channel
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorPhaseErrorBase,
)

CLOSE_TIMEOUT_SECONDS = 5.0
"""How long closing waits for the broker's ``close-ok`` before leaving the socket to pika."""


@dataclass(frozen=True, slots=True)
class Returned:
    """The broker returned the message (``mandatory``): no queue is bound for its routing key."""

    reply_text: str


@dataclass(frozen=True, slots=True)
class Nacked:
    """The broker nacked the message: a queue refused it, or storing it failed."""


@dataclass(frozen=True, slots=True)
class Lost:
    """The channel or its connection closed before the broker confirmed the message."""

    error: BaseException


class _Pending:
    """Not answered yet (the broker's confirm is still awaited)."""


PENDING: Final = _Pending()
NACKED: Final = Nacked()

Outcome = None | Returned | Nacked | Lost | _Pending
"""What became of one message: None once confirmed."""

Message = tuple[str, bytes, pika.spec.BasicProperties]
"""A message to publish: its routing key, body and properties (``message_id`` set)."""


class Group:
    """The messages of one :meth:`ConfirmChannel.publish`, settled as the broker answers."""

    __slots__ = ("done", "left", "outcomes")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.outcomes: list[Outcome] = [PENDING] * size
        """Each message's outcome, in publish order."""
        self.left = size
        self.done: asyncio.Future[None] = loop.create_future()
        """Done once every message is settled."""
        if not size:
            self.done.set_result(None)

    def settle(self, index: int, outcome: Outcome) -> None:
        """Record the outcome of the message at ``index`` (the first word on it is kept)."""
        if self.outcomes[index] is not PENDING:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


class ConfirmChannel:
    """One connection and its channel in confirm mode, on the running event loop.

    :meth:`open` connects; :meth:`publish` writes a group's messages at once, in order, and
    returns the :class:`Group` its outcomes come into; :meth:`wait` awaits them. ``error`` is
    set once the channel or its connection closed: nothing more can be published on it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._connection: AsyncioConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._opened: asyncio.Future[None] = loop.create_future()
        self._closed: asyncio.Future[None] = loop.create_future()
        self.error: BaseException | None = None
        """Why the channel cannot publish any more (it or its connection closed)."""
        # The delivery tag of the last message published: RabbitMQ numbers a confirm
        # channel's messages from 1, and answers by these numbers.
        self._tag = 0
        # Each message in flight, by delivery tag: its group, its place there, its message id.
        self._pending: dict[int, tuple[Group, int, str]] = {}
        # The delivery tags in flight, oldest first, for the acks that settle every message up
        # to a tag; settled ones are dropped from the front as they reach it.
        self._order: deque[int] = deque()
        # The delivery tags in flight by message id, oldest first: a return names its message
        # by the message's properties alone, and RabbitMQ returns a channel's messages in
        # publish order.
        self._by_message_id: dict[str, deque[int]] = {}
        self._returned: dict[int, str] = {}

    @classmethod
    async def open(cls, parameters: pika.URLParameters, exchange: str) -> ConfirmChannel:
        """Connect, open a channel in confirm mode and, unless ``exchange`` is ``""``, check
        that the exchange exists (a passive declare). Raises pika's error when a step fails
        (``ChannelClosedByBroker`` with reply code 404 for an exchange that does not exist);
        a cancelled or failed opening leaves no connection behind."""
        opening = cls(asyncio.get_running_loop())
        try:
            await opening._open(parameters, exchange)
        except BaseException:
            await opening.close()
            raise
        return opening

    async def _open(self, parameters: pika.URLParameters, exchange: str) -> None:
        def on_connection_open(connection: Any) -> None:
            connection.channel(on_open_callback=on_channel_open)

        def on_channel_open(channel: pika.channel.Channel) -> None:
            self._channel = channel
            channel.add_on_close_callback(self._on_channel_closed)
            channel.add_on_return_callback(self._on_return)
            channel.confirm_delivery(self._on_confirm, callback=on_confirm_mode)

        def on_confirm_mode(_: Any) -> None:
            if exchange and self._channel is not None:
                self._channel.exchange_declare(exchange, passive=True, callback=on_exchange)
            else:
                on_exchange(None)

        def on_exchange(_: Any) -> None:
            if not self._opened.done():
                self._opened.set_result(None)

        self._connection = AsyncioConnection(
            parameters,
            on_open_callback=on_connection_open,
            on_open_error_callback=self._on_connection_closed,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._loop,
        )
        await self._opened

    def publish(self, exchange: str, messages: Iterable[Message], size: int) -> Group:
        """Write ``size`` messages to ``exchange``, ``mandatory``, in order, with no wait in
        between (so that no other group's messages come between them); their outcomes come
        into the group returned. Raises what stops the channel from taking the first."""
        group = Group(size, self._loop)
        channel = self._channel
        if self.error is not None or channel is None:
            raise self.error or ConnectionError("the channel is not open")
        pending, order, by_message_id = self._pending, self._order, self._by_message_id
        index = 0
        try:
            for index, (routing_key, body, properties) in enumerate(messages):
                channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
                self._tag += 1
                tag = self._tag
                message_id = properties.message_id
                pending[tag] = (group, index, message_id)
                order.append(tag)
                tags = by_message_id.get(message_id)
                if tags is None:
                    by_message_id[message_id] = deque((tag,))
                else:
                    tags.append(tag)
        except Exception as error:
            if index == 0:
                raise
            # The channel closed under the group (pika refuses a publish on a closed
            # channel): what is left of it was never written.
            for left in range(index, size):
                group.settle(left, Lost(error))
        return group

    async def wait(self, group: Group, timeout: float) -> None:
        """Wait until every message of ``group`` is settled, ``timeout`` seconds at most (the
        messages then still ``PENDING`` were not answered in time)."""
        if not group.done.done():
            await asyncio.wait((group.done,), timeout=timeout)

    async def close(self) -> None:
        """Close the channel and its connection (every message in flight settles as lost)."""
        connection = self._connection
        if connection is not None and not (connection.is_closing or connection.is_closed):
            connection.close()
        if connection is not None and not self._closed.done():
            await asyncio.wait((self._closed,), timeout=CLOSE_TIMEOUT_SECONDS)
        self._fail(self.error or pika.exceptions.ConnectionClosedByClient(200, "closed"))

    def _on_confirm(self, frame: pika.frame.Method[Any]) -> None:
        method = frame.method
        nacked = isinstance(method, pika.spec.Basic.Nack)
        tag: int = method.delivery_tag
        order = self._order
        if method.multiple:
            while order and order[0] <= tag:
                self._settle(order.popleft(), nacked)
        else:
            self._settle(tag, nacked)
            while order and order[0] not in self._pending:
                order.popleft()

    def _settle(self, tag: int, nacked: bool) -> None:
        entry = self._pending.pop(tag, None)
        if entry is None:
            return
        group, index, message_id = entry
        tags = self._by_message_id.get(message_id)
        if tags is not None:
            if tags[0] == tag:
                tags.popleft()
            elif tag in tags:
                tags.remove(tag)
            if not tags:
                del self._by_message_id[message_id]
        returned = self._returned.pop(tag, None)
        if returned is not None:
            group.settle(index, Returned(returned))
        else:
            group.settle(index, NACKED if nacked else None)

    def _on_return(
        self,
        channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        tags = self._by_message_id.get(properties.message_id)
        if tags:
            # RabbitMQ sends the return before the ack of the same message.
            self._returned[tags.popleft()] = method.reply_text or "NO_ROUTE"
            if not tags:
                del self._by_message_id[properties.message_id]

    def _on_channel_closed(self, channel: pika.channel.Channel, error: BaseException) -> None:
        self._fail(error)
        connection = self._connection
        if connection is not None and connection.is_open:
            connection.close()

    def _on_connection_closed(self, connection: Any, error: BaseException | str) -> None:
        self._fail(error if isinstance(error, BaseException) else ConnectionError(error))
        if not self._closed.done():
            self._closed.set_result(None)

    def _fail(self, error: BaseException) -> None:
        """Nothing more is published here: opening fails, every message in flight is lost."""
        if self.error is None:
            self.error = error
        if not self._opened.done():
            self._opened.set_exception(error)
            # Retrieved by open(), unless it was cancelled first.
            self._opened.exception()
        pending, self._pending = self._pending, {}
        self._order.clear()
        self._by_message_id.clear()
        self._returned.clear()
        lost = Lost(error)
        for group, index, _ in pending.values():
            group.settle(index, lost)


def cause(error: BaseException) -> BaseException:
    """The error that says what happened, out of pika's connection-workflow wrappers (a
    refused connection comes as an ``AMQPConnectionError`` around a workflow failure around a
    socket error)."""
    while True:
        if isinstance(error, AMQPConnectionWorkflowFailed) and error.exceptions:
            error = error.exceptions[-1]
        elif isinstance(error, AMQPConnectorPhaseErrorBase):
            error = error.exception
        elif (
            type(error) is pika.exceptions.AMQPConnectionError
            and error.args
            and isinstance(error.args[0], BaseException)
        ):
            error = error.args[0]
        else:
            return error
