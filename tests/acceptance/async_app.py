"""An application with an async handler, for running ``outbox work`` on one.

``outbox --app tests.acceptance.async_app:app ...`` loads it. Its handler records what it
handled in ``handled.log`` in the form of :mod:`tests.acceptance.cli_app`'s handlers (so the
same readers apply), after awaiting ``OUTBOX_TEST_SLEEP_SECONDS`` (default 0).
"""

from __future__ import annotations

import asyncio
import os

from outbox import Batch, Outbox, Settings
from tests.acceptance.cli_app import HANDLED_LOG, RETRY, SLEEP_ENV, _append
from tests.models import ActivityEvent

app = Outbox(settings=Settings(rescue_interval=0.5))


@app.handler(ActivityEvent, batch_size=10, retry=RETRY)
async def push_activity(batch: Batch[ActivityEvent]) -> None:
    """Record the batch's event ids once an await has let the loop run something else."""
    await asyncio.sleep(float(os.environ.get(SLEEP_ENV, "0")))
    prefix = f"{batch.handler} {batch.group_id} {batch.attempt} {os.getpid()}"
    _append(HANDLED_LOG, [f"{prefix} {event.id}" for event in batch.events])
