"""The shop's Celery application, with outbox installed on it.

The shop's own task, ``orders.place``, writes an order and its ``OrderPlaced`` event in one
transaction; its beat schedule sends ``orders.report`` every minute. ``install`` adds outbox's
three tasks (distribution and rescue on the beat, one job per message) on a queue of their own,
``outbox``, and leaves every setting of the shop as it was. The handler is the ready-made
RabbitMQ sink: each event becomes one persistent message on the ``orders.placed`` queue, a
group of up to 500 published with one wait for the broker's confirms.

Run, each in its own terminal (from the repository root, with the ``dev`` extra installed)::

    python -m examples.celery_orders init                      # tables, outbox's, the queue
    celery -A examples.celery_orders.tasks worker --queues outbox --concurrency 4
    celery -A examples.celery_orders.tasks worker --queues shop   # the shop's own tasks
    celery -A examples.celery_orders.tasks beat
    python -m examples.celery_orders place 1200                # 1,200 orders.place tasks
    python -m examples.celery_orders received                  # what RabbitMQ holds
"""

from __future__ import annotations

import logging
import os

from celery import Celery
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from examples.celery_orders.models import Order, OrderPlaced
from outbox import Outbox
from outbox.executors.celery import install
from outbox.sinks.rabbitmq import RabbitMQSink

DATABASE_URL_ENV = "ORDERS_DATABASE_URL"
BROKER_URL_ENV = "ORDERS_BROKER_URL"
RABBITMQ_URL_ENV = "ORDERS_RABBITMQ_URL"
OUTBOX_QUEUE_ENV = "ORDERS_OUTBOX_QUEUE"
PLACED_QUEUE_ENV = "ORDERS_PLACED_QUEUE"
DEFAULT_DATABASE_URL = "sqlite:///celery_orders.sqlite3"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
GROUP_SIZE = 500

rabbitmq_url = os.environ.get(RABBITMQ_URL_ENV, DEFAULT_RABBITMQ_URL)
placed_queue = os.environ.get(PLACED_QUEUE_ENV, "orders.placed")

# Celery on RabbitMQ, as the shop already runs it: its own queue, routes and schedule.
celery = Celery("orders", broker=os.environ.get(BROKER_URL_ENV, rabbitmq_url))
celery.conf.update(
    task_default_queue="shop",
    beat_schedule={"orders.report": {"task": "orders.report", "schedule": 60.0}},
)

outbox = Outbox(os.environ.get(DATABASE_URL_ENV, DEFAULT_DATABASE_URL))

# One message per event on the default exchange, which routes by queue name; the message id is
# `<table>-<event id>`, the same on every attempt: what a consumer de-duplicates by.
publish_orders = RabbitMQSink(rabbitmq_url, exchange="", routing_key=placed_queue)
outbox.handler(OrderPlaced, batch_size=GROUP_SIZE, name="publish_orders")(publish_orders)

executor = install(celery, outbox, queue=os.environ.get(OUTBOX_QUEUE_ENV, "outbox"))

log = logging.getLogger(__name__)


@celery.task(name="orders.place")
def place(customer: str, total_cents: int) -> int:
    """Write an order and its event in one transaction; the order's id."""
    with Session(outbox.engine) as session, session.begin():
        order = Order(customer=customer, total_cents=total_cents)
        session.add(order)
        session.flush()
        session.add(OrderPlaced(order_id=order.id, customer=customer, total_cents=total_cents))
        return order.id


@celery.task(name="orders.report")
def report() -> int:
    """The shop's own periodic task: log how many orders there are."""
    with Session(outbox.engine) as session:
        count = int(session.scalar(select(func.count()).select_from(Order)) or 0)
    log.info("orders: %d", count)
    return count
