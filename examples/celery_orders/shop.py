"""The example's chores: its tables and queue, orders placed as ``orders.place`` places them,
and what RabbitMQ received."""

from __future__ import annotations

import json
from typing import Any

import pika
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from examples.celery_orders.models import Base, Order, OrderPlaced
from outbox import schema


def init(database_url: str, rabbitmq_url: str, queue: str) -> None:
    """The shop's tables, outbox's tables (``outbox migrate`` in production) and the durable
    queue the events go to."""
    engine = create_engine(database_url)
    try:
        Base.metadata.create_all(engine)
        schema.metadata.create_all(engine)
    finally:
        engine.dispose()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        connection.channel().queue_declare(queue, durable=True)
    finally:
        connection.close()


def place_orders(database_url: str, count: int) -> list[int]:
    """Write ``count`` orders and their events, one transaction each, as ``orders.place``
    does; their ids."""
    engine = create_engine(database_url)
    ids = []
    try:
        for n in range(count):
            with Session(engine) as session, session.begin():
                order = Order(customer=f"customer-{n % 7}", total_cents=100 + n)
                session.add(order)
                session.flush()
                session.add(
                    OrderPlaced(
                        order_id=order.id, customer=order.customer, total_cents=order.total_cents
                    )
                )
                ids.append(order.id)
    finally:
        engine.dispose()
    return ids


def received(rabbitmq_url: str, queue: str) -> list[dict[str, Any]]:
    """Every message on the queue, taken off it: its ``message_id`` and its body."""
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    messages = []
    try:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return messages
            messages.append({"message_id": properties.message_id, "body": json.loads(body)})
    finally:
        connection.close()
