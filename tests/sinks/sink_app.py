"""The application the sinks' kill test runs through the real ``outbox work`` command.

``SINK_KIND`` names a module of ``tests/sinks/kinds``, ``SINK_DESTINATION`` what it sends to (a
stream, a subject, an exchange, an API's URL) and ``SINK_SYNC=1`` picks the sync class. Its one
handler, ``to_sink``, is that sink: groups of ``BATCH_SIZE`` in id order per account, retried
every half second (kills use up attempts; the test proves delivery, not dead-lettering).
"""

from __future__ import annotations

import importlib
import os

from outbox import Outbox, RetryPolicy, Settings
from tests.models import SinkEvent

KIND_ENV = "SINK_KIND"
DESTINATION_ENV = "SINK_DESTINATION"
SYNC_ENV = "SINK_SYNC"
BATCH_SIZE = 50
# Rescue every half second and forget a silent worker after 3 s, so that the groups of killed
# workers come back quickly; a lease of 10 s bounds the rest. Idle workers look for work every
# 0.1 s (SQLite and MariaDB have no LISTEN to wake them).
SETTINGS = Settings(
    rescue_interval=0.5, worker_stale_after=3.0, lease_seconds=10.0, poll_interval=0.1
)
RETRY = RetryPolicy(max_attempts=100, scale=0.0, base_delay=0.5, jitter=0.0)

app = Outbox(settings=SETTINGS)

if KIND_ENV in os.environ:
    kind = importlib.import_module(f"tests.sinks.kinds.{os.environ[KIND_ENV]}")
    sink = kind.make_sink(os.environ[DESTINATION_ENV], sync=os.environ.get(SYNC_ENV) == "1")
    app.handler(
        SinkEvent, name="to_sink", batch_size=BATCH_SIZE, ordering_key="account", retry=RETRY
    )(sink)
