"""RabbitMQ as a sink kind: per test, an exchange of its own and a queue bound to it, on the
shared broker (``OUTBOX_TEST_RABBITMQ_URL``, default guest on 127.0.0.1:5672), deleted after.

:func:`make_sink` and :func:`read_stored` build the same sink and read the same queue from a
destination's name alone, so that an application in a subprocess can send where a test reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pytest

from outbox.sinks.rabbitmq import KEY_HEADER, AsyncRabbitMQSink, RabbitMQSink
from tests.sinks._contract import SECRET, NamedDownstream, Stored, closed_port, require_service

RABBITMQ_URL = os.environ.get("OUTBOX_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
ROUTING_KEY = "events"
"""The routing key the destination's queue is bound with (the sinks' default)."""

# What read_stored took from each queue so far: reading a message off a queue removes it.
_taken: dict[str, list[Stored]] = {}


def make_sink(destination: str, *, sync: bool, **options: Any) -> Any:
    """A sink publishing to ``destination``'s exchange with :data:`ROUTING_KEY` (``options``
    override the sink's other arguments)."""
    options.setdefault("routing_key", ROUTING_KEY)
    cls = RabbitMQSink if sync else AsyncRabbitMQSink
    return cls(options.pop("url", RABBITMQ_URL), exchange=destination, **options)


def read_stored(destination: str) -> list[Stored]:
    """Every message ``destination``'s queue received, in queue order: those taken by earlier
    calls, then those waiting now."""
    taken = _taken.setdefault(destination, [])
    taken += asyncio.run(_take(destination))
    return list(taken)


async def _take(queue_name: str) -> list[Stored]:
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=True)
        stored = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            key = (message.headers or {}).get(KEY_HEADER)
            stored.append(
                Stored(
                    message_id=str(message.message_id),
                    key=None if key is None else str(key),
                    values=json.loads(message.body),
                )
            )
        return stored


async def declare(
    name: str, routing_key: str = ROUTING_KEY, arguments: dict[str, Any] | None = None
) -> None:
    """Declare exchange ``name`` (direct) and queue ``name`` (with ``arguments``) bound to it
    by ``routing_key``."""
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT)
        queue = await channel.declare_queue(name, arguments=arguments)
        await queue.bind(exchange, routing_key)


async def delete(name: str) -> None:
    """Delete exchange and queue ``name``."""
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)
        await channel.exchange_delete(name)


class RabbitMQDownstream(NamedDownstream):
    """An exchange and its queue for one test."""

    make = staticmethod(make_sink)
    read = staticmethod(read_stored)

    def unreachable_sink(self, *, sync: bool) -> Any:
        """A sink whose password is the secret, pointed at a closed port."""
        return make_sink(
            self.name, sync=sync, url=f"amqp://guest:{SECRET}@127.0.0.1:{closed_port()}/"
        )


DEDUPLICATES = False
"""RabbitMQ stores a re-sent message again: consumers de-duplicate by its message_id."""


@contextlib.contextmanager
def destination(arguments: dict[str, Any] | None = None) -> Iterator[str]:
    """A direct exchange and a queue (declared with ``arguments``) bound to it by
    :data:`ROUTING_KEY`, both named ``outbox-test-<uuid>`` (the name given), deleted at the
    end."""
    parts = urlsplit(RABBITMQ_URL)
    require_service("RabbitMQ", parts.hostname or "127.0.0.1", parts.port or 5672)
    name = f"outbox-test-{uuid.uuid4().hex[:12]}"
    asyncio.run(declare(name, arguments=arguments))
    try:
        yield name
    finally:
        _taken.pop(name, None)
        asyncio.run(delete(name))


@pytest.fixture
def rabbitmq_downstream() -> Iterator[RabbitMQDownstream]:
    """An exchange and its queue for one test (see :func:`destination`)."""
    with destination() as name:
        yield RabbitMQDownstream(name)
