"""The handler: ``OrderPlaced`` events go to the fulfilment service, up to 500 in one call.

``register_handlers(outbox, app)`` is what ``create_app`` hands to ``init_outbox``: it registers
``ship_orders`` on the application's Outbox with options from the application's config (a test
gives ``FULFILMENT_RETRY`` retries without delays) and runs it inside the application's context,
where it reads ``current_app.config`` as a view would.
"""

from __future__ import annotations

from collections import defaultdict

import httpx
from flask import Flask, current_app

from examples.flask_orders.models import OrderPlaced
from examples.flask_orders.outbox_ext import in_app_context
from outbox import Batch, Outbox, RetryPolicy, Urgency

BULK_PATH = "/v1/orders/bulk"
# The service takes at most 500 records per call: the handler's batch_size matches it.
API_MAX_RECORDS = 500
# 2 s, 17 s, 82 s, 257 s, then every 5 minutes (10 attempts in about half an hour): a
# fulfilment service is down for minutes, not days.
DEFAULT_RETRY = RetryPolicy(max_attempts=10, base_delay=1.0, max_delay=300.0)
# Where `flask --app examples.flask_orders.fake_fulfilment run --port 8027` listens.
DEFAULT_FULFILMENT_API_URL = "http://127.0.0.1:8027"
DEFAULT_TIMEOUT_SECONDS = 30.0


def register_handlers(outbox: Outbox, app: Flask) -> None:
    """Register the application's handlers on its Outbox (see ``outbox_ext.init_outbox``)."""
    outbox.handler(
        OrderPlaced,
        batch_size=API_MAX_RECORDS,
        urgency=Urgency.MINUTES,  # a customer waits for their parcel
        retry=app.config["FULFILMENT_RETRY"],
    )(in_app_context(app, ship_orders))


def ship_orders(batch: Batch[OrderPlaced]) -> None:
    """Send one group of orders to the fulfilment service in one bulk call.

    Returning means the group is done: its rows are deleted. Raising means this attempt failed:
    the whole group is retried with backoff, and after its last attempt it is dead-lettered into
    the archive. Orders the service will never take are discarded (archived with its reason),
    and the rest of the group succeeds.
    """
    config = current_app.config
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
    response = httpx.post(
        config["FULFILMENT_API_URL"] + BULK_PATH,
        json={"records": records},
        # The group id: a group's events never change, so every attempt at it is the same
        # request, and a repeat after a crash is answered without being applied twice.
        headers={"Idempotency-Key": str(batch.group_id)},
        timeout=config["FULFILMENT_TIMEOUT_SECONDS"],
    )
    # 5xx: the service took nothing; fail the attempt and let outbox retry the group.
    response.raise_for_status()
    events = {str(event.order_id): event for event in batch.events}
    refused: dict[str, list[OrderPlaced]] = defaultdict(list)
    for error in response.json()["errors"]:
        refused[error["reason"]].append(events[error["order_id"]])
    for reason, orders in refused.items():
        batch.discard(orders, reason)
