"""The application :mod:`benchmarks.celery_vs_work` runs under both executors: one handler, one
buffer, outbox's settings at their defaults, and a Celery application with outbox installed.

``outbox --app benchmarks.celery_app:outbox work ...`` and ``celery -A
benchmarks.celery_app:celery worker|beat ...`` both load it, so both run the same handler with
the same settings. Steered by environment variables read at import: ``BENCH_CELERY_BROKER_URL``,
``BENCH_CELERY_QUEUE`` (outbox's queue; the application's own default queue is
``<queue>-app``), ``BENCH_BATCH_SIZE`` (default 1000), ``BENCH_HANDLER_SECONDS`` (how long a
call takes, default 0.5) and ``BENCH_RECORD_DIR``.

The handler records each call in ``record-<pid>.log`` under ``BENCH_RECORD_DIR``, one fsynced
write a line: ``start <group> <attempt> <pid> <unix time> <events>`` when it begins, and
``end <group> <attempt> <pid> <unix time> <events>`` when it returns.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox
from outbox.executors.celery import install

BROKER_URL_ENV = "BENCH_CELERY_BROKER_URL"
QUEUE_ENV = "BENCH_CELERY_QUEUE"
BATCH_SIZE_ENV = "BENCH_BATCH_SIZE"
HANDLER_SECONDS_ENV = "BENCH_HANDLER_SECONDS"
RECORD_DIR_ENV = "BENCH_RECORD_DIR"

QUEUE = os.environ.get(QUEUE_ENV, "outbox-bench")
BATCH_SIZE = int(os.environ.get(BATCH_SIZE_ENV, "1000"))
HANDLER_SECONDS = float(os.environ.get(HANDLER_SECONDS_ENV, "0.5"))


class Base(DeclarativeBase):
    pass


class CeleryBenchEvent(BufferMixin, Base):
    """An event."""

    __tablename__ = "bench_celery_events"
    note: Mapped[str] = mapped_column(String(40), default="")


outbox = Outbox()  # OUTBOX_DATABASE_URL, or the command's --database-url


def _record(line: str) -> None:
    directory = os.environ.get(RECORD_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"record-{os.getpid()}.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@outbox.handler(CeleryBenchEvent, batch_size=BATCH_SIZE, name="bench_deliver")
def bench_deliver(batch: Batch[CeleryBenchEvent]) -> None:
    """Take ``HANDLER_SECONDS``, as a bulk call to a downstream would."""
    where = f"{batch.group_id} {batch.attempt} {os.getpid()}"
    _record(f"start {where} {time.time()!r} {len(batch.events)}")
    time.sleep(HANDLER_SECONDS)
    _record(f"end {where} {time.time()!r} {len(batch.events)}")


celery = Celery("bench", broker=os.environ.get(BROKER_URL_ENV, "amqp://guest:guest@127.0.0.1//"))
celery.conf.update(task_default_queue=f"{QUEUE}-app")
install(celery, outbox, queue=QUEUE)
