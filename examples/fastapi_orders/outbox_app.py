"""The outbox side: the ``Outbox`` on the application's database, and the async handler.

``ship_orders`` receives ``OrderPlaced`` events in groups of up to 500 and sends each group to
the fulfilment service in ONE bulk call, with ``httpx.AsyncClient``. Run the worker beside
uvicorn::

    outbox --app examples.fastapi_orders.outbox_app:outbox migrate
    outbox --app examples.fastapi_orders.outbox_app:outbox work
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from typing import Any

import httpx

from examples.fastapi_orders.database import database_url
from examples.fastapi_orders.models import OrderPlaced
from outbox import Batch, Outbox, RetryPolicy, Urgency

FULFILMENT_API_URL_ENV = "FULFILMENT_API_URL"
# Where `uvicorn examples.fastapi_orders.fake_bulk_api:app --port 8026` listens.
DEFAULT_FULFILMENT_API_URL = "http://127.0.0.1:8026"
BULK_PATH = "/v1/orders/bulk"
# The service takes at most 500 records per call: the handler's batch_size matches it.
API_MAX_RECORDS = 500
API_TIMEOUT_SECONDS = 30.0

# The web application's own async URL (aiosqlite, asyncpg): outbox does its own work (claims,
# bookkeeping) on a sync engine it derives from it, and runs async handlers on an event loop.
outbox = Outbox(database_url())


@functools.cache
def fulfilment_client() -> httpx.AsyncClient:
    """The worker process's one client: its connection pool serves every group.

    Made on first use, not at import: its connections belong to the event loop that outbox runs
    async handlers on, and a ``work --processes N`` worker is forked after the import.
    """
    base_url = os.environ.get(FULFILMENT_API_URL_ENV, DEFAULT_FULFILMENT_API_URL)
    return httpx.AsyncClient(base_url=base_url, timeout=API_TIMEOUT_SECONDS)


@outbox.handler(
    OrderPlaced,
    batch_size=API_MAX_RECORDS,
    urgency=Urgency.MINUTES,  # a customer waits for their parcel
    # 2 s, 17 s, 82 s, then every 5 minutes: a busy warehouse is busy for moments, not hours.
    retry=RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=300.0),
)
async def ship_orders(batch: Batch[OrderPlaced]) -> None:
    """Send one group of orders to the fulfilment service in one bulk call.

    Returning means the group is done: its rows are deleted. Raising means this attempt failed:
    the whole group is retried with backoff. The service answers per record too: a record it
    cannot take now is retried in a group of its own, one it will never take is discarded
    (archived with the reason), and the rest of the group succeeds.
    """
    records = [
        {
            "order_id": str(event.order_id),
            "customer": event.customer,
            "sku": event.sku,
            "quantity": event.quantity,
            "country": event.country,
        }
        for event in batch.events
    ]
    response = await fulfilment_client().post(
        BULK_PATH,
        json={"records": records},
        # The group id: a group's events never change, so every attempt at it is the same
        # request, and a repeat after a crash is answered without being applied twice.
        headers={"Idempotency-Key": str(batch.group_id)},
    )
    # 429 and 5xx: the service took nothing; fail the attempt and let outbox retry the group.
    response.raise_for_status()
    _sort_out_errors(batch, response.json()["errors"])


def _sort_out_errors(batch: Batch[OrderPlaced], errors: list[dict[str, Any]]) -> None:
    """Hand the records the service refused back to outbox, grouped by reason."""
    events = {str(event.order_id): event for event in batch.events}
    retry: dict[str, list[OrderPlaced]] = defaultdict(list)
    discard: dict[str, list[OrderPlaced]] = defaultdict(list)
    for error in errors:
        (retry if error["retryable"] else discard)[error["reason"]].append(
            events[error["order_id"]]
        )
    for reason, refused in retry.items():
        batch.retry(refused, reason)
    for reason, refused in discard.items():
        batch.discard(refused, reason)
