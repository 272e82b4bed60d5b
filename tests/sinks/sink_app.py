"""The application the sinks' kill test runs through the real ``outbox work`` command.

``SINK_KIND`` names a module of ``tests/sinks/kinds``, ``SINK_DESTINATION`` what it sends to (a
stream, a subject, an exchange, an API's URL) and ``SINK_SYNC=1`` picks the sync class. Its one
handler, ``to_sink``, is that sink: groups of ``BATCH_SIZE`` in id order per account, retried
every half second (kills use up attempts; the test proves delivery, not dead-lettering).

``SINK_HOLD_SECONDS`` (default 0): how long the handler holds a group after the sink sent it,
before outbox records it done. A local broker takes a group in a millisecond or two; held, the
moment when every message is acknowledged and outbox does not know it yet, where a kill makes
the group be sent again, is long enough for a kill to land in.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from typing import Any

from outbox import Batch, Outbox, RetryPolicy, Settings
from outbox.sinks import AsyncSink
from tests.models import SinkEvent

KIND_ENV = "SINK_KIND"
DESTINATION_ENV = "SINK_DESTINATION"
SYNC_ENV = "SINK_SYNC"
HOLD_ENV = "SINK_HOLD_SECONDS"
BATCH_SIZE = 50
# Rescue every half second and forget a silent worker after 3 s, so that the groups of killed
# workers come back quickly; a lease of 10 s bounds the rest. Idle workers look for work every
# 0.1 s (SQLite and MariaDB have no LISTEN to wake them).
SETTINGS = Settings(
    rescue_interval=0.5, worker_stale_after=3.0, lease_seconds=10.0, poll_interval=0.1
)
RETRY = RetryPolicy(max_attempts=100, scale=0.0, base_delay=0.5, jitter=0.0)

app = Outbox(settings=SETTINGS)


class Held:
    """A sync sink whose groups are held a while once sent; its hooks are the sink's."""

    def __init__(self, sink: Any, seconds: float) -> None:
        self.sink, self.seconds = sink, seconds
        self.outbox_start, self.outbox_stop = sink.outbox_start, sink.outbox_stop
        self.outbox_guarantee = sink.outbox_guarantee

    def __call__(self, batch: Batch[Any]) -> None:
        self.sink(batch)
        time.sleep(self.seconds)


class AsyncHeld(Held):
    """An async sink whose groups are held a while once sent."""

    async def __call__(self, batch: Batch[Any]) -> None:  # type: ignore[override]
        await self.sink(batch)
        await asyncio.sleep(self.seconds)


if KIND_ENV in os.environ:
    kind = importlib.import_module(f"tests.sinks.kinds.{os.environ[KIND_ENV]}")
    sink = kind.make_sink(os.environ[DESTINATION_ENV], sync=os.environ.get(SYNC_ENV) == "1")
    hold = float(os.environ.get(HOLD_ENV, "0"))
    if hold:
        sink = (AsyncHeld if isinstance(sink, AsyncSink) else Held)(sink, hold)
    app.handler(
        SinkEvent, name="to_sink", batch_size=BATCH_SIZE, ordering_key="account", retry=RETRY
    )(sink)
