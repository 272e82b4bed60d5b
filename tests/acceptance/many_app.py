"""An application serving several databases, run through the real ``outbox`` command.

Its registry is a function reading ``MANY_DATABASES`` (JSON: name -> URL, or ``@path`` of a
file holding it) each time it is asked, as a tenant registry would. Its one handler appends
``<tenant> <event id> <pid>`` per event to ``MANY_OUTPUT`` and fsyncs it, so what was
delivered, and from which database (each event names the database it was written to), is
counted from outside.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, Settings

DATABASES_ENV = "MANY_DATABASES"
OUTPUT_ENV = "MANY_OUTPUT"


class Base(DeclarativeBase):
    pass


class TenantEvent(BufferMixin, Base):
    """An event, naming the database it was written to."""

    __tablename__ = "tenant_events"
    tenant: Mapped[str] = mapped_column(String(40))


def registry() -> dict[str, str]:
    """``MANY_DATABASES``: the JSON itself, or ``@path`` of a file holding it (read each time,
    so that a test can change the registry under a running command)."""
    text = os.environ.get(DATABASES_ENV, "{}")
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    listed: dict[str, str] = json.loads(text)
    return listed


app = Outbox(databases=registry, settings=Settings(worker_stale_after=5.0))


@app.handler(TenantEvent, batch_size=25)
def deliver(batch: Batch[TenantEvent]) -> None:
    lines = "".join(f"{e.tenant} {e.id} {os.getpid()}\n" for e in batch.events)
    fd = os.open(os.environ[OUTPUT_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, lines.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
