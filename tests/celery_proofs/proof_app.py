"""The Celery application the Celery proofs run: a shop's Celery app with outbox installed on
it by the one documented call, as a Celery shop installs it, and one recording handler.

``celery -A tests.celery_proofs.proof_app:celery worker|beat ...`` loads it; the test process
imports it too, for the buffer model. Everything that varies from proof to proof comes from the
environment, read at import (each worker and beat process imports it afresh):

- ``OUTBOX_DATABASE_URL``: the database (outbox's own setting);
- ``PROOF_BROKER_URL``: the broker (RabbitMQ ``amqp://``, Redis ``redis://``);
- ``PROOF_QUEUE``: the application's own default queue, ``PROOF_OUTBOX_QUEUE`` outbox's (one
  of each per test, so that no message of another test's run is ever delivered here);
- ``PROOF_DISTRIBUTE_EVERY``: the distribution tick, in seconds;
- ``PROOF_LEASE_SECONDS``, ``PROOF_STALE_SECONDS``: outbox's lease and how long a silent worker
  may be silent (:class:`outbox.Settings`);
- ``PROOF_BATCH_SIZE``, ``PROOF_MAX_ATTEMPTS``, ``PROOF_HANDLER_SECONDS``: the handler's group
  size, attempts, and how long a call takes;
- ``PROOF_SUICIDE=1``: the handler SIGKILLs its own process, every call (a poison group);
- ``PROOF_VISIBILITY_TIMEOUT``: Redis's visibility timeout, swept every second (the user's
  broker settings, as a shop with long tasks on Redis sets them), with ``task_acks_late``;
- ``PROOF_RECORD_DIR``: where the handler records what it did (below);
- ``PROOF_OUTBOX_LEVEL``: the level of outbox's logger (``DEBUG`` shows its debug lines in the
  worker's log, which runs at INFO).

The handler records each call in ``record-<pid>.log`` under ``PROOF_RECORD_DIR``, one fsynced
write per line, so that what it did survives a SIGKILL a moment later:

- ``start <group> <attempt> <pid> <unix time>`` when the call begins;
- ``event <event id> <group> <attempt> <pid>`` for each event, delivered halfway through the
  call (a process killed in the second half delivered a group it never finished);
- ``end <group> <attempt> <pid> <unix time>`` when the call returns.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from celery import Celery
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy, Settings
from outbox.executors import celery as outbox_celery

BROKER_URL_ENV = "PROOF_BROKER_URL"
QUEUE_ENV = "PROOF_QUEUE"
OUTBOX_QUEUE_ENV = "PROOF_OUTBOX_QUEUE"
DISTRIBUTE_EVERY_ENV = "PROOF_DISTRIBUTE_EVERY"
LEASE_SECONDS_ENV = "PROOF_LEASE_SECONDS"
STALE_SECONDS_ENV = "PROOF_STALE_SECONDS"
BATCH_SIZE_ENV = "PROOF_BATCH_SIZE"
MAX_ATTEMPTS_ENV = "PROOF_MAX_ATTEMPTS"
HANDLER_SECONDS_ENV = "PROOF_HANDLER_SECONDS"
SUICIDE_ENV = "PROOF_SUICIDE"
VISIBILITY_TIMEOUT_ENV = "PROOF_VISIBILITY_TIMEOUT"
RECORD_DIR_ENV = "PROOF_RECORD_DIR"
OUTBOX_LEVEL_ENV = "PROOF_OUTBOX_LEVEL"

HANDLER = "deliver"
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"

DISTRIBUTE_EVERY = float(os.environ.get(DISTRIBUTE_EVERY_ENV, "0.5"))
LEASE_SECONDS = float(os.environ.get(LEASE_SECONDS_ENV, "5"))
STALE_SECONDS = float(os.environ.get(STALE_SECONDS_ENV, "3"))
BATCH_SIZE = int(os.environ.get(BATCH_SIZE_ENV, "20"))
MAX_ATTEMPTS = int(os.environ.get(MAX_ATTEMPTS_ENV, "100"))
HANDLER_SECONDS = float(os.environ.get(HANDLER_SECONDS_ENV, "0.5"))
SUICIDE = os.environ.get(SUICIDE_ENV) == "1"

# Expired leases are looked for every half second: a killed process's group comes back about
# when its lease ends, which is what the proofs measure. A failed group is due again at once.
SETTINGS = Settings(
    lease_seconds=LEASE_SECONDS, rescue_interval=0.5, worker_stale_after=STALE_SECONDS
)
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, scale=0.0, base_delay=0.2, jitter=0.0)


class Base(DeclarativeBase):
    pass


class ProofEvent(BufferMixin, Base):
    """An event; ``label`` says which round of a proof wrote it."""

    __tablename__ = "celery_proof_events"
    label: Mapped[str] = mapped_column(String(40), default="")


celery = Celery("proofs", broker=os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:6379/0"))
celery.conf.update(
    task_default_queue=os.environ.get(QUEUE_ENV, "proofs"),
    worker_log_format=LOG_FORMAT,
    worker_task_log_format=LOG_FORMAT,
)
if VISIBILITY_TIMEOUT_ENV in os.environ:
    celery.conf.update(
        task_acks_late=True,
        broker_transport_options={
            "visibility_timeout": float(os.environ[VISIBILITY_TIMEOUT_ENV]),
            # Swept every second, not every 100 s: the timeout takes effect when it says.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
    )

if OUTBOX_LEVEL_ENV in os.environ:
    logging.getLogger("outbox").setLevel(os.environ[OUTBOX_LEVEL_ENV])

outbox = Outbox(settings=SETTINGS)


def record_path(directory: str | Path, pid: int) -> Path:
    """The file one process records its handler calls in."""
    return Path(directory) / f"record-{pid}.log"


def _record(lines: list[str]) -> None:
    directory = os.environ.get(RECORD_DIR_ENV)
    if not directory:
        return
    data = "".join(f"{line}\n" for line in lines).encode()
    fd = os.open(record_path(directory, os.getpid()), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


@outbox.handler(ProofEvent, batch_size=BATCH_SIZE, retry=RETRY, archive=True, name=HANDLER)
def deliver(batch: Batch[ProofEvent]) -> None:
    """Deliver the group downstream (one durable line per event) halfway through the call."""
    pid = os.getpid()
    where = f"{batch.group_id} {batch.attempt} {pid}"
    _record([f"start {where} {time.time()!r}"])
    if SUICIDE:
        # A poison group: whatever it holds takes its process down (the OOM killer, a
        # segfaulting extension), every time it is handed over.
        os.kill(pid, signal.SIGKILL)
    time.sleep(HANDLER_SECONDS / 2)
    _record([f"event {e.id} {where}" for e in batch.events])
    time.sleep(HANDLER_SECONDS / 2)
    _record([f"end {where} {time.time()!r}"])


outbox_celery.install(
    celery,
    outbox,
    queue=os.environ.get(OUTBOX_QUEUE_ENV, "outbox"),
    distribute_every=DISTRIBUTE_EVERY,
)
