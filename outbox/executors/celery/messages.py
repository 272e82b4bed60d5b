"""The messages outbox sends on Celery: the tasks they name, the queue they go to, the beat's
entries, when they are sent and how long they live, and the header that names the tick a
distribution message is for."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

DEFAULT_QUEUE = "outbox"
DEFAULT_DISTRIBUTE_EVERY_SECONDS = 1.0
"""Seconds between distributions: a new event waits about this long for its claim job (the
same as ``outbox work``'s default)."""
RUN_JOB_TASK = "outbox.run_job"
DISTRIBUTE_TASK = "outbox.distribute"
RESCUE_TASK = "outbox.rescue"
BEAT_ENTRIES = (DISTRIBUTE_TASK, RESCUE_TASK)
"""The names of the entries :func:`outbox.executors.celery.install` adds to the beat schedule
(the tasks' own names)."""
OVERDUE_AFTER_SECONDS = 30.0
"""A due job that no message has taken for this long gets one from the rescue task's sweep. A
message waiting behind a queue's backlog is taken for lost too, and its job gets a second one,
which finds the job leased or gone: a no-op."""
SWEEP_LIMIT = 100
"""The most messages one sweep publishes for overdue jobs (the most urgent first)."""
MAX_COUNTDOWN_SECONDS = 300.0
"""A group due again within this long (a retry's backoff, a deferral, a rate limit's turn) gets
its message at once with a countdown; one due later is left to the sweep, so that a worker does
not hold hours of countdown messages in memory."""
DUE_MARGIN_SECONDS = 0.05
"""A countdown message arrives this long after its job is due: the database's clock decides."""
MESSAGE_EXPIRY_PERIODS = 10
"""A beat message that waited this many of its periods is dropped: a later one does its work."""
BEAT_SENDS_PER_TICK = 4
"""The beat sends ``outbox.distribute`` this many times a tick: a beat sends each entry a
little later than its period (about 1.24 s for 1 s here), and a tick that no message names is
not distributed. Each message names the tick it was sent in (``SENT_AT_HEADER``); the first to
run takes it, the others find it taken (at no cost in a process that took or found it taken
already), and extra messages cost little."""
SENT_AT_HEADER = "outbox_sent_at"
"""The header a distribution message carries: when it was sent (Unix seconds, by the sending
host's clock), which names the tick the message is for."""


def stamp_sent_at(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """Stamp a distribution message with when it was sent (the beat's clock), which names its
    tick, unless its sender stamped it already."""
    if sender == DISTRIBUTE_TASK and isinstance(headers, dict):
        headers.setdefault(SENT_AT_HEADER, time.time())


def sent_at(request: Any) -> dt.datetime | None:
    """When a distribution message was sent, from its header; None when it has none (sent
    by an older outbox, called eagerly) or an unreadable one: the task then takes the tick the
    database's clock is in."""
    value = getattr(request, SENT_AT_HEADER, None)
    if value is None:
        headers = getattr(request, "headers", None)
        value = headers.get(SENT_AT_HEADER) if isinstance(headers, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return dt.datetime.fromtimestamp(value, dt.UTC)
