"""The fault application (``tests.faults.fault_app``) on several databases at once.

``Outbox(databases=...)`` reads ``FAULT_DATABASES`` (JSON: name -> URL). Each database holds
the fault application's tables; its producer writes events whose ``producer`` column is the
database's name. The handler delivers as ``fault_app``'s does, into a directory per database
(``<FAULT_HANDLED_DIR>/<producer>/handled-<pid>.log``): the fault suite's checker then counts
each database apart, and an event delivered by another database's worker shows there as a
phantom.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from outbox import Batch, Outbox
from tests.faults.fault_app import (
    BATCH_SIZE,
    HANDLED_DIR_ENV,
    HANDLER_SECONDS,
    RETRY,
    SETTINGS,
    FaultEvent,
    handled_path,
)

DATABASES_ENV = "FAULT_DATABASES"


def registry() -> dict[str, str]:
    listed: dict[str, str] = json.loads(os.environ.get(DATABASES_ENV, "{}"))
    return listed


app = Outbox(databases=registry, settings=SETTINGS)


@app.handler(FaultEvent, batch_size=BATCH_SIZE, retry=RETRY, archive=True)
def deliver(batch: Batch[FaultEvent]) -> None:
    """Deliver halfway through the batch's time, one durable line per event, as
    ``fault_app.deliver`` does, into the directory of the events' database."""
    called_at = time.time()
    time.sleep(HANDLER_SECONDS / 2)
    head = f"{batch.group_id} {batch.attempt} {os.getpid()} {called_at:.3f}"
    by_database: dict[str, list[str]] = {}
    for event in batch.events:
        by_database.setdefault(event.producer, []).append(f"{event.event_key} {head}\n")
    for name, lines in by_database.items():
        directory = Path(os.environ[HANDLED_DIR_ENV]) / name
        directory.mkdir(exist_ok=True)
        fd = os.open(handled_path(directory, os.getpid()), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, "".join(lines).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    time.sleep(HANDLER_SECONDS / 2)
