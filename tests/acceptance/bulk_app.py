"""An application that sends its events to a bulk API the way a user's would: one call per
group, ``RetryAfter`` on a 429, per-record rejections discarded, calls refused whole bisected,
and a fleet-wide ``RateLimit`` a little under the API's.

``BULK_API_URL``: the fake API (``examples.marketing_sync.fake_api``); ``BULK_CALLS_PER_SECOND``:
the handler's limit; ``BULK_STARTS_FILE``: a file each call's start (Unix time) is appended to.
Events of kind ``no_email`` are records the API rejects one by one; kind ``poison`` makes it
refuse the whole call.
"""

from __future__ import annotations

import os
import time

import httpx

from examples.marketing_sync.fake_api import BULK_PATH
from outbox import Batch, Outbox, RateLimit, RetryAfter, RetryPolicy, Settings
from tests.models import ActivityEvent

URL_ENV = "BULK_API_URL"
CALLS_PER_SECOND_ENV = "BULK_CALLS_PER_SECOND"
STARTS_ENV = "BULK_STARTS_FILE"
BATCH_SIZE = 500
# Bisecting a group of 500 down to one event takes 9 halvings: room for them and a retry.
RETRY = RetryPolicy(max_attempts=12, scale=0.0, base_delay=0.2, jitter=0.0)

app = Outbox(settings=Settings(rescue_interval=0.5))
_client = httpx.Client(timeout=30)


@app.handler(
    ActivityEvent,
    batch_size=BATCH_SIZE,
    retry=RETRY,
    rate_limit=RateLimit(calls_per_second=float(os.environ.get(CALLS_PER_SECOND_ENV, "18"))),
    bisect=True,
)
def sync_bulk(batch: Batch[ActivityEvent]) -> None:
    """One bulk call per group; the group id is the idempotency key."""
    starts = os.environ.get(STARTS_ENV)
    if starts:
        with open(starts, "a", encoding="utf-8") as file:
            file.write(f"{time.time():.6f}\n")
    records = [
        {
            "id": str(row.id),
            "email": None if row.kind == "no_email" else f"user{row.activity_id}@example.com",
            "kind": row.kind,
        }
        for row in batch.rows
    ]
    response = _client.post(
        os.environ[URL_ENV] + BULK_PATH,
        json={"records": records},
        headers={"Idempotency-Key": str(batch.group_id)},
    )
    if response.status_code == 429:
        raise RetryAfter(response.headers.get("Retry-After", "1"), reason="429")
    response.raise_for_status()
    rejected = {item["id"] for item in response.json()["rejected"]}
    if rejected:
        batch.discard([e for e in batch.events if str(e.id) in rejected], "missing email")
