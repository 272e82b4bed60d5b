"""The outbox side: the ``Outbox`` on the application's database, and the async handler.

``ship_orders``, the ready-made async bulk HTTP sink (``outbox.sinks.http``), receives
``OrderPlaced`` events in groups of up to 500 and sends each group to the fulfilment service in
ONE bulk call, with an ``httpx.AsyncClient``; the application writes the request body and reads
the service's answer. Run the worker beside uvicorn::

    outbox --app examples.fastapi_orders.outbox_app:outbox migrate
    outbox --app examples.fastapi_orders.outbox_app:outbox work
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import httpx

from examples.fastapi_orders.database import database_url
from examples.fastapi_orders.models import OrderPlaced
from outbox import Outbox, RetryPolicy, Urgency
from outbox.sinks import Rejection
from outbox.sinks.http import AsyncBulkHTTPSink

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


def fulfilment_url(events: Sequence[OrderPlaced]) -> str:
    """The bulk endpoint, read when a call is made, so that a worker can be pointed anywhere."""
    return os.environ.get(FULFILMENT_API_URL_ENV, DEFAULT_FULFILMENT_API_URL) + BULK_PATH


def order_records(events: Sequence[OrderPlaced]) -> dict[str, Any]:
    """The request body for one group of orders."""
    return {
        "records": [
            {
                "order_id": str(event.order_id),
                "customer": event.customer,
                "sku": event.sku,
                "quantity": event.quantity,
                "country": event.country,
            }
            for event in events
        ]
    }


def sort_out_errors(
    response: httpx.Response, events: Sequence[OrderPlaced]
) -> list[Rejection[Any]]:
    """The service's answer, read: it lists the orders it refused, each ``retryable`` (it may
    take it later: retried in a group of its own) or not (never: discarded, archived with the
    reason); the others were taken. A result mapper of the application's own, as this service
    answers in a shape of its own."""
    by_order = {str(event.order_id): event for event in events}
    return [
        Rejection(by_order[error["order_id"]], error["reason"], retry=error["retryable"])
        for error in response.json()["errors"]
    ]


# The ready-made bulk HTTP sink, async (an httpx.AsyncClient on the event loop outbox runs
# async handlers on): one call per group, the group id as its Idempotency-Key, so a repeat after
# a crash is answered without being applied twice; 429 and 5xx fail the attempt as a whole.
ship_orders = AsyncBulkHTTPSink(
    fulfilment_url,
    allowed_hosts=[httpx.URL(fulfilment_url([])).host],
    body=order_records,
    result=sort_out_errors,
    timeout=API_TIMEOUT_SECONDS,
)

outbox.handler(
    OrderPlaced,
    name="ship_orders",
    batch_size=API_MAX_RECORDS,
    urgency=Urgency.MINUTES,  # a customer waits for their parcel
    # 2 s, 17 s, 82 s, then every 5 minutes: a busy warehouse is busy for moments, not hours.
    retry=RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=300.0),
)(ship_orders)
