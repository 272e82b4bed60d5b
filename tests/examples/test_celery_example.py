"""The Celery example end to end: a real ``celery worker`` (prefork) of outbox's queue and a
real ``celery beat`` on RabbitMQ publish every order's event to the RabbitMQ queue, once, in
groups; and ``orders.place``, the shop's own task, writes an order and its event together."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

from examples.celery_orders import shop, tasks
from examples.celery_orders.models import OrderPlaced
from outbox import schema
from tests._support import count_rows, wait_for
from tests.conftest import reset_schema
from tests.executors._processes import RABBITMQ_URL
from tests.hosts._hosts import Host, start

ORDERS = 1200
DRAIN_SECONDS = 60.0


@dataclass
class Run:
    """One run of the example: the orders placed and what the queue received."""

    placed: list[int]
    received: list[dict[str, Any]]
    archived_groups: int


def _delete_queue(queue: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        connection.channel().queue_delete(queue)
    finally:
        connection.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Place 1,200 orders with the worker and the beat running, and wait for them all."""
    tmp = tmp_path_factory.mktemp("celery_orders")
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        reset_schema(url)
    else:
        url = f"sqlite:///{tmp}/orders.sqlite3"
    suffix = uuid.uuid4().hex[:12]
    env = {
        tasks.DATABASE_URL_ENV: url,
        tasks.BROKER_URL_ENV: RABBITMQ_URL,
        tasks.RABBITMQ_URL_ENV: RABBITMQ_URL,
        tasks.OUTBOX_QUEUE_ENV: f"outbox-{suffix}",
        tasks.PLACED_QUEUE_ENV: f"orders-placed-{suffix}",
    }
    shop.init(url, RABBITMQ_URL, env[tasks.PLACED_QUEUE_ENV])
    app = [sys.executable, "-m", "celery", "-A", "examples.celery_orders.tasks"]
    hosts: list[Host] = [
        start([*app, "worker", "--queues", env[tasks.OUTBOX_QUEUE_ENV], "--concurrency", "2",
               "--loglevel", "INFO", "--without-gossip", "--without-mingle"],
              tmp / "worker.log", env),
        start([*app, "beat", "--schedule", str(tmp / "beat-schedule"), "--loglevel", "INFO"],
              tmp / "beat.log", env),
    ]  # fmt: skip
    try:
        placed = shop.place_orders(url, ORDERS)
        wait_for(lambda: count_rows(url, OrderPlaced) == 0, "every event published", DRAIN_SECONDS)
        yield Run(
            placed,
            shop.received(RABBITMQ_URL, env[tasks.PLACED_QUEUE_ENV]),
            count_rows(url, schema.archive),
        )
    finally:
        for host in reversed(hosts):
            host.stop()
        _delete_queue(env[tasks.PLACED_QUEUE_ENV])


def test_every_order_is_published_once(run: Run) -> None:
    """One message per order, carrying its order's id, and no other."""
    assert sorted(run.placed) == sorted(m["body"]["order_id"] for m in run.received)


def test_each_message_carries_its_events_id_for_consumers_to_deduplicate_by(run: Run) -> None:
    """``message_id`` is the event's own, ``<table>-<id>``: distinct, stable across attempts."""
    ids = [m["message_id"] for m in run.received]
    assert (ORDERS, True) == (
        len(set(ids)),
        all(i.startswith(f"{OrderPlaced.__tablename__}-") for i in ids),
    )


def test_the_settings_of_the_shop_stay_its_own(run: Run) -> None:
    """The shop's default queue and its own beat entry are kept beside outbox's two."""
    assert ("shop", {"orders.report", "outbox.distribute", "outbox.rescue"}) == (
        tasks.celery.conf.task_default_queue,
        set(tasks.celery.conf.beat_schedule),
    )


def test_nothing_is_archived(run: Run) -> None:
    """The sink's handler does not archive: a published event leaves no row behind."""
    assert 0 == run.archived_groups


def test_the_readme_names_the_worker_and_beat_commands() -> None:
    """The README shows the commands the test runs."""
    readme = (Path(__file__).parents[2] / "examples" / "celery_orders" / "README.md").read_text()
    assert "celery -A examples.celery_orders.tasks worker --queues outbox" in readme
    assert "celery -A examples.celery_orders.tasks beat" in readme
