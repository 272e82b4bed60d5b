"""The application the fault suite runs through the real ``outbox work`` command.

``outbox --app tests.faults.fault_app:app --database-url URL work ...`` loads it. Its one
handler, ``deliver``, stands for a bulk call to a downstream API: it appends one line per event
to a file of its own process (``handled-<pid>.log`` under ``FAULT_HANDLED_DIR``) and fsyncs it
before it returns, so what it delivered survives the worker being SIGKILLed and the database
restarting (a table would be rolled back or lost with the very faults under test). The handler
archives (``archive=True``): every completion that committed leaves one archive row per event,
so two commits for one group show as two archive rows for one event.

Steered by environment variables read at import: ``FAULT_BATCH_SIZE`` (default 50),
``FAULT_MAX_ATTEMPTS`` (default 100: faults use up attempts, and the suite proves delivery, not
dead-lettering), ``FAULT_HANDLER_SECONDS`` (how long a batch takes, default 0.02; the
delivery lands halfway through) and ``FAULT_NETWORK_TIMEOUT`` (``Settings.network_timeout``,
when set).

A line of a handled file is ``<event_key> <group_id> <attempt> <pid> <called_at>``, the last
the wall-clock time (``time.time()``) the handler was called at.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy, Settings

HANDLED_DIR_ENV = "FAULT_HANDLED_DIR"
BATCH_SIZE_ENV = "FAULT_BATCH_SIZE"
MAX_ATTEMPTS_ENV = "FAULT_MAX_ATTEMPTS"
HANDLER_SECONDS_ENV = "FAULT_HANDLER_SECONDS"
NETWORK_TIMEOUT_ENV = "FAULT_NETWORK_TIMEOUT"

BATCH_SIZE = int(os.environ.get(BATCH_SIZE_ENV, "50"))
MAX_ATTEMPTS = int(os.environ.get(MAX_ATTEMPTS_ENV, "100"))
HANDLER_SECONDS = float(os.environ.get(HANDLER_SECONDS_ENV, "0.02"))

# Rescue every half second and forget a silent worker after 5 s (defaults: 5 s and 60 s), so
# that groups of killed workers, and the distribution of a killed leader, come back quickly.
SETTINGS = Settings(rescue_interval=0.5, worker_stale_after=5.0)
if os.environ.get(NETWORK_TIMEOUT_ENV):  # only then: the upgrade tier runs older releases too
    SETTINGS = Settings(
        rescue_interval=0.5,
        worker_stale_after=5.0,
        network_timeout=float(os.environ[NETWORK_TIMEOUT_ENV]),
    )
# A failed group is due again half a second later.
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, scale=0.0, base_delay=0.5, jitter=0.0)


class Base(DeclarativeBase):
    pass


class FaultEvent(BufferMixin, Base):
    """An event; ``event_key`` is unique across the run, committed or rolled back."""

    __tablename__ = "fault_events"
    event_key: Mapped[int] = mapped_column(BigInteger, unique=True)
    producer: Mapped[str] = mapped_column(String(40))


class FaultProof(Base):
    """Written in the same transaction as its event: the proof that the event committed."""

    __tablename__ = "fault_proof"
    event_key: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


app = Outbox(settings=SETTINGS)


def handled_path(directory: str | Path, pid: int) -> Path:
    """The file a worker process appends its deliveries to."""
    return Path(directory) / f"handled-{pid}.log"


def _append(lines: list[str]) -> None:
    directory = os.environ.get(HANDLED_DIR_ENV)
    if not directory:
        return
    data = "".join(f"{line}\n" for line in lines).encode()
    fd = os.open(handled_path(directory, os.getpid()), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


@app.handler(FaultEvent, batch_size=BATCH_SIZE, retry=RETRY, archive=True)
def deliver(batch: Batch[FaultEvent]) -> None:
    """Deliver the batch downstream (one durable line per event), then wait for the answer.

    The delivery lands halfway through the batch's time, as with a real bulk call: a worker
    killed in the second half has delivered a group it never got to record.
    """
    called_at = time.time()
    time.sleep(HANDLER_SECONDS / 2)
    pid = os.getpid()
    head = f"{batch.group_id} {batch.attempt} {pid} {called_at:.3f}"
    _append([f"{e.event_key} {head}" for e in batch.events])
    time.sleep(HANDLER_SECONDS / 2)
