"""The RabbitMQ sink's confirm channel, fed the broker's answers by hand: each message settles
from the ack, nack or return that names it, acks of every message up to a tag settle across
groups, and a connection that closes settles what is in flight as lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pika.frame
import pika.spec
import pytest

from outbox.sinks._amqp import NACKED, PENDING, ConfirmChannel, Group, Lost, Returned


class _Channel:
    """Takes what is published, as a channel in confirm mode would."""

    def __init__(self) -> None:
        self.published: list[str] = []

    def basic_publish(
        self, exchange: str, routing_key: str, body: bytes, properties: Any, mandatory: bool
    ) -> None:
        self.published.append(properties.message_id)


@pytest.fixture
def channel() -> Iterator[ConfirmChannel]:
    """A confirm channel whose channel takes every publish, on a loop of its own."""
    loop = asyncio.new_event_loop()
    made = ConfirmChannel(loop)
    made._channel = _Channel()
    yield made
    loop.close()


def _publish(channel: ConfirmChannel, *message_ids: str) -> Group:
    messages = [
        ("events", b"{}", pika.BasicProperties(message_id=message_id)) for message_id in message_ids
    ]
    return channel.publish("orders", messages, len(messages))


def _ack(channel: ConfirmChannel, tag: int, multiple: bool = False, nack: bool = False) -> None:
    method = pika.spec.Basic.Nack if nack else pika.spec.Basic.Ack
    channel._on_confirm(pika.frame.Method(1, method(delivery_tag=tag, multiple=multiple)))


def _return(channel: ConfirmChannel, message_id: str) -> None:
    method = pika.spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE")
    properties = pika.BasicProperties(message_id=message_id)
    channel._on_return(channel._channel, method, properties, b"{}")


def test_an_ack_up_to_a_tag_settles_every_message_before_it_across_groups(
    channel: ConfirmChannel,
) -> None:
    """An ack with ``multiple`` confirms every message up to its tag, whatever its group."""
    first = _publish(channel, "e-1", "e-2", "e-3")
    second = _publish(channel, "e-4", "e-5")

    _ack(channel, 4, multiple=True)

    assert ([None, None, None], [None, PENDING]) == (first.outcomes, second.outcomes)
    assert (True, False) == (first.done.done(), second.done.done())


def test_a_nack_and_acks_out_of_order_settle_only_the_messages_they_name(
    channel: ConfirmChannel,
) -> None:
    """Single acks and nacks in any order each settle their own message."""
    group = _publish(channel, "e-1", "e-2", "e-3")

    _ack(channel, 3)
    _ack(channel, 2, nack=True)
    _ack(channel, 1)

    assert [None, NACKED, None] == group.outcomes
    assert group.done.done()


def test_a_returned_message_is_reported_returned_when_its_ack_comes(
    channel: ConfirmChannel,
) -> None:
    """A return names its message by message id; the ack that follows settles it returned,
    the others of the group confirmed."""
    group = _publish(channel, "e-1", "e-2", "e-3")

    _return(channel, "e-2")
    _ack(channel, 3, multiple=True)

    assert [None, Returned("NO_ROUTE"), None] == group.outcomes


def test_returns_of_one_message_id_name_its_messages_in_publish_order(
    channel: ConfirmChannel,
) -> None:
    """Two messages in flight with one message id: a return is the older one's."""
    first = _publish(channel, "e-1")
    second = _publish(channel, "e-1")

    _return(channel, "e-1")
    _ack(channel, 2, multiple=True)

    assert ([Returned("NO_ROUTE")], [None]) == (first.outcomes, second.outcomes)


def test_the_connection_closing_settles_what_is_in_flight_as_lost(
    channel: ConfirmChannel,
) -> None:
    """The connection lost: every message not confirmed is lost, with the error; the channel
    takes no more."""
    group = _publish(channel, "e-1", "e-2")
    _ack(channel, 1)
    error = pika.exceptions.StreamLostError("Transport indicated EOF")

    channel._on_connection_closed(None, error)

    assert [None, Lost(error)] == group.outcomes
    assert error is channel.error
    with pytest.raises(pika.exceptions.StreamLostError):
        _publish(channel, "e-3")
