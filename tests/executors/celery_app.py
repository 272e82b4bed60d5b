"""A Celery application with outbox installed, as the executor's tests run it in real ``celery
worker`` and ``celery beat`` processes, configured by environment variables.

``deliver`` appends one line per call (its group's size and first event's id) to the file
``CALLS_ENV`` names, so a test counts calls and sizes across processes; on a group's first
attempt it sleeps ``SLOW_ENV`` seconds when set (a handler that is busy when its process is
stopped), and with ``FAIL_FIRST_ENV`` set it fails it. Its events are archived when they
succeed: the archive tells which were delivered.
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
SOFT_SHUTDOWN_ENV = "EXECUTOR_SOFT_SHUTDOWN_SECONDS"
FAIL_FIRST_ENV = "EXECUTOR_FAIL_FIRST"
BATCH_SIZE = 100
STALE_ENV = "EXECUTOR_STALE_SECONDS"
# Long enough that only a give-back, never a silent heartbeat or a lease's end, explains a job
# taken again within a test's wait; a test of a silent heartbeat shortens the stale age alone.
SETTINGS = Settings(lease_seconds=120.0, worker_stale_after=float(os.environ.get(STALE_ENV, "120")))
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
    """Record the call; on a first attempt, fail (``FAIL_FIRST_ENV``) or take ``SLOW_ENV``
    seconds."""
    calls = os.environ.get(CALLS_ENV)
    if calls:
        with open(calls, "a", encoding="utf-8") as out:
            out.write(f"{len(batch.events)} {batch.events[0].id} {os.getpid()}\n")
    if os.environ.get(FAIL_FIRST_ENV) and batch.attempt == 1:
        raise RuntimeError("the downstream is down")
    slow = float(os.environ.get(SLOW_ENV, "0"))
    if slow and batch.attempt == 1:
        time.sleep(slow)


class CappedDelivery(BufferMixin, Base):
    """An event of a handler that may run one group at a time, fleet-wide."""

    __tablename__ = "executor_capped_deliveries"

    n: Mapped[int]


@outbox.handler(CappedDelivery, batch_size=BATCH_SIZE, archive=True, concurrency=1)
def deliver_one_at_a_time(batch: Batch[CappedDelivery]) -> None:
    """Record the call, and ``overlap`` when another call of it is under way in any process
    (its marker file exists): the cap of one was not held."""
    calls = os.environ[CALLS_ENV]
    marker = f"{calls}.running"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        fd = None
    try:
        with open(calls, "a", encoding="utf-8") as out:
            out.write(f"{len(batch.events)} capped {'ok' if fd is not None else 'overlap'}\n")
        time.sleep(0.3)  # long enough for a second call to start, were one let in
    finally:
        if fd is not None:
            os.close(fd)
            os.remove(marker)


broker = os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:6379/0")
celery = Celery("executor_tests", broker=broker)
celery.conf.update(worker_log_format=LOG_FORMAT, worker_hijack_root_logger=True)
if SOFT_SHUTDOWN_ENV in os.environ:
    celery.conf.worker_soft_shutdown_timeout = float(os.environ[SOFT_SHUTDOWN_ENV])
if OUTBOX_LEVEL_ENV in os.environ:
    logging.getLogger("outbox").setLevel(os.environ[OUTBOX_LEVEL_ENV])

executor = install(
    celery,
    outbox,
    queue=os.environ.get(QUEUE_ENV, "outbox"),
    distribute_every=0.5,
    rescue_every=1.0,
)
