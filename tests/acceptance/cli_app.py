"""The application the acceptance tests run through the real ``outbox`` command.

``outbox --app tests.acceptance.cli_app:app ...`` loads it; the database URL comes from the
command line or ``OUTBOX_DATABASE_URL``. Its handlers are steered by environment variables, read
when the module is imported (batch size, attempts) or when a batch runs (the rest):

- ``OUTBOX_TEST_OUTPUT_DIR``: where the handlers write ``started.log`` (one line per batch, when
  it starts) and ``handled.log`` (one line per event, once the batch is done). Both are
  flushed and fsynced per batch, so they survive the process being killed.
- ``OUTBOX_TEST_SLEEP_SECONDS``: how long each batch takes (default 0).
- ``OUTBOX_TEST_FAIL``: ``1`` makes every batch raise; a fraction (``0.3``) makes that share
  of the batches raise, at random.
- ``OUTBOX_TEST_BATCH_SIZE``: the handlers' batch size (default 10).
- ``OUTBOX_TEST_MAX_ATTEMPTS``: the handlers' ``RetryPolicy.max_attempts`` (default 8).
- ``OUTBOX_TEST_CALLS_PER_SECOND``: a ``RateLimit`` of ``record_activity`` (default none).
- ``OUTBOX_TEST_RATE_LIMIT``: that ``RateLimit``'s options instead, ``name=number`` separated
  by commas (``calls_per_second=10,burst=5``).
- ``OUTBOX_TEST_ORDERED``: ``1`` gives ``record_activity`` the ordering key ``activity_id``.
- ``OUTBOX_TEST_WORKER_STALE_AFTER``: ``Settings.worker_stale_after`` in seconds (default: the
  library's).

Lines are ``<handler> <group_id> <attempt> <pid>`` followed, in ``started.log``, by the Unix time
the batch started and, in ``handled.log``, by the event id.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from outbox import Batch, BufferMixin, Outbox, RateLimit, RetryPolicy, Settings
from tests.models import ActivityEvent, EmailEvent

OUTPUT_DIR_ENV = "OUTBOX_TEST_OUTPUT_DIR"
SLEEP_ENV = "OUTBOX_TEST_SLEEP_SECONDS"
FAIL_ENV = "OUTBOX_TEST_FAIL"
BATCH_SIZE_ENV = "OUTBOX_TEST_BATCH_SIZE"
MAX_ATTEMPTS_ENV = "OUTBOX_TEST_MAX_ATTEMPTS"
CALLS_PER_SECOND_ENV = "OUTBOX_TEST_CALLS_PER_SECOND"
RATE_LIMIT_ENV = "OUTBOX_TEST_RATE_LIMIT"
ORDERED_ENV = "OUTBOX_TEST_ORDERED"
WORKER_STALE_AFTER_ENV = "OUTBOX_TEST_WORKER_STALE_AFTER"
# A file: each batch, once started, waits while it exists (at most HOLD_SECONDS), so that a
# test decides when the batch in flight ends.
HOLD_ENV = "OUTBOX_TEST_HOLD_FILE"
HOLD_SECONDS = 60.0

STARTED_LOG = "started.log"
HANDLED_LOG = "handled.log"

BATCH_SIZE = int(os.environ.get(BATCH_SIZE_ENV, "10"))
# A short, fixed backoff: a failed group is due again half a second later.
RETRY = RetryPolicy(
    max_attempts=int(os.environ.get(MAX_ATTEMPTS_ENV, "8")), scale=0.0, base_delay=0.5, jitter=0.0
)

_calls_per_second = os.environ.get(CALLS_PER_SECOND_ENV)
RATE_LIMIT = None if not _calls_per_second else RateLimit(calls_per_second=float(_calls_per_second))
if os.environ.get(RATE_LIMIT_ENV):
    _options = (option.split("=") for option in os.environ[RATE_LIMIT_ENV].split(","))
    RATE_LIMIT = RateLimit(**{name: float(value) if "." in value else int(value)
                              for name, value in _options})  # fmt: skip

# Rescue expired leases every half second (default 5 s), so that killed workers' groups come
# back within the tests' time budget; lease and poll interval come from the command line.
_stale_after = os.environ.get(WORKER_STALE_AFTER_ENV)
app = Outbox(
    settings=Settings(rescue_interval=0.5)
    if not _stale_after
    else Settings(rescue_interval=0.5, worker_stale_after=float(_stale_after))
)

_write_lock = threading.Lock()


def _append(name: str, lines: Sequence[str]) -> None:
    directory = os.environ.get(OUTPUT_DIR_ENV)
    if not directory:
        return
    with _write_lock, (Path(directory) / name).open("a", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))
        file.flush()
        os.fsync(file.fileno())


def _handle(batch: Batch[BufferMixin]) -> None:
    prefix = f"{batch.handler} {batch.group_id} {batch.attempt} {os.getpid()}"
    _append(STARTED_LOG, [f"{prefix} {time.time():.6f}"])
    time.sleep(float(os.environ.get(SLEEP_ENV, "0")))
    hold = os.environ.get(HOLD_ENV)
    deadline = time.monotonic() + HOLD_SECONDS
    while hold and Path(hold).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fail = float(os.environ.get(FAIL_ENV) or 0)
    if fail >= 1 or (fail > 0 and random.random() < fail):
        raise RuntimeError("the downstream API refused the batch (on purpose)")
    _append(HANDLED_LOG, [f"{prefix} {event.id}" for event in batch.events])


@app.handler(
    ActivityEvent,
    batch_size=BATCH_SIZE,
    retry=RETRY,
    rate_limit=RATE_LIMIT,
    ordering_key="activity_id" if os.environ.get(ORDERED_ENV) == "1" else None,
)
def record_activity(batch: Batch[ActivityEvent]) -> None:
    """Record the batch's event ids, as a bulk API call would deliver them."""
    _handle(batch)  # type: ignore[arg-type]


@app.handler(EmailEvent, batch_size=BATCH_SIZE, retry=RETRY)
def record_email(batch: Batch[EmailEvent]) -> None:
    """Record the batch's event ids, as a bulk API call would deliver them."""
    _handle(batch)  # type: ignore[arg-type]
