"""A Celery application with outbox installed, as the executor's tests run it in real ``celery
worker`` and ``celery beat`` processes, configured by environment variables.

``deliver`` appends one line per call (its group's size and first event's id) to the file
``CALLS_ENV`` names, so a test counts calls and sizes across processes; on a group's first
attempt it sleeps ``SLOW_ENV`` seconds when set (a handler that is busy when its process is
stopped). Its events are archived when they succeed: the archive tells which were delivered.
"""

from __future__ import annotations

import logging
import os
import time

from celery import Celery
from sqlalchemy.orm import DeclarativeBase, Mapped

from outbox import Batch, BufferMixin, Outbox, Settings
from outbox.executors.celery import install

DATABASE_URL_ENV = "EXECUTOR_DATABASE_URL"
BROKER_URL_ENV = "EXECUTOR_BROKER_URL"
QUEUE_ENV = "EXECUTOR_QUEUE"
CALLS_ENV = "EXECUTOR_CALLS"
SLOW_ENV = "EXECUTOR_SLOW_SECONDS"
OUTBOX_LEVEL_ENV = "EXECUTOR_OUTBOX_LEVEL"
BATCH_SIZE = 100
# Long enough that only a give-back, never a silent heartbeat or a lease's end, explains a job
# taken again within a test's wait.
SETTINGS = Settings(lease_seconds=120.0, worker_stale_after=120.0)
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"


class Base(DeclarativeBase):
    """The test application's declarative base."""


class Delivery(BufferMixin, Base):
    """An event to deliver."""

    __tablename__ = "executor_deliveries"

    n: Mapped[int]


outbox = Outbox(os.environ.get(DATABASE_URL_ENV, "sqlite://"), settings=SETTINGS)


@outbox.handler(Delivery, batch_size=BATCH_SIZE, archive=True)
def deliver(batch: Batch[Delivery]) -> None:
    """Record the call; on a first attempt, take ``SLOW_ENV`` seconds."""
    calls = os.environ.get(CALLS_ENV)
    if calls:
        with open(calls, "a", encoding="utf-8") as out:
            out.write(f"{len(batch.events)} {batch.events[0].id} {os.getpid()}\n")
    slow = float(os.environ.get(SLOW_ENV, "0"))
    if slow and batch.attempt == 1:
        time.sleep(slow)


broker = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:6379/0")
celery = Celery("executor_tests", broker=broker)
celery.conf.update(worker_log_format=LOG_FORMAT, worker_hijack_root_logger=True)
if OUTBOX_LEVEL_ENV in os.environ:
    logging.getLogger("outbox").setLevel(os.environ[OUTBOX_LEVEL_ENV])

executor = install(
    celery,
    outbox,
    queue=os.environ.get(QUEUE_ENV, "outbox"),
    distribute_every=0.5,
    rescue_every=1.0,
)
