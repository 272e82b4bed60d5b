"""An application a newcomer writes from docs/flow-control.md for a bulk API that limits the
whole client and each account: one call per account's group, both limits said, each answer
given its lever.

The API (``examples.marketing_sync.fake_api``, at ``ACCOUNTS_API_URL``) takes up to
``API_CALLS_PER_SECOND`` calls a second from the client and ``API_ACCOUNT_CALLS_PER_SECOND``
from each account; the handler keeps under each (``FLEET_CALLS``, ``ACCOUNT_CALLS``), as the
docs advise against a downstream that counts arrivals. Per record, the API answers
``422`` for a record without an email (kind ``no_email``) and ``429`` with ``retry_after`` for
the records of an account over its limit (an account on a smaller plan than the handler
knows); a record of kind ``poison`` makes it refuse the whole call with ``400``, saying not
which; during an outage it answers ``503`` with ``Retry-After``.

With ``ACCOUNTS_HANDLER=sink`` the handler is the ready-made bulk HTTP sink instead
(``outbox.sinks.http``), given the same options: the request body and the result mapper are
all the application writes.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import Index, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import outbox
from examples.marketing_sync.fake_api import BULK_PATH
from outbox import Batch, BufferMixin, CircuitBreaker, Outbox, RateLimit, RetryPolicy, Settings
from outbox.sinks.http import BulkHTTPSink, StatusList

URL_ENV = "ACCOUNTS_API_URL"
HANDLER_ENV = "ACCOUNTS_HANDLER"
API_CALLS_PER_SECOND = 10
API_ACCOUNT_CALLS_PER_SECOND = 4
# Under each of the API's limits: the fleet counts starts, the API counts arrivals, which
# the scheduling of a loaded machine spreads (three processes and the API on two CPUs put 10
# arrivals in a second under 9 starts, and now and then 11: a call under was not enough).
FLEET_CALLS = API_CALLS_PER_SECOND - 2
ACCOUNT_CALLS = API_ACCOUNT_CALLS_PER_SECOND - 1
BATCH_SIZE = 100
# Halving a group of 100 down to one event takes 7 failed attempts: room for them and more.
RETRY = RetryPolicy(max_attempts=10, scale=0.0, base_delay=0.2, jitter=0.0)
BREAKER = CircuitBreaker(failures=3, probe_after=5)
# What the handler puts in the DataError of a call refused whole (the API's error follows).
REFUSED_WHOLE = "400 from the API, the whole call refused"

TABLE = "test_account_activity_events"


class Base(DeclarativeBase):
    """This application's own buffer."""


class AccountActivityEvent(BufferMixin, Base):
    """An activity of one account's contact, for the bulk API."""

    __tablename__ = TABLE
    # The record's id at the API, chosen by the application when it writes the event.
    ref: Mapped[str] = mapped_column(String(40))
    account_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32), default="viewed")
    # A keyed buffer wants its unclaimed rows by key, beside the buffer's own indexes.
    __table_args__ = (
        *BufferMixin.buffer_indexes(TABLE),
        Index(
            f"ix_{TABLE}_unclaimed_account",
            "account_id",
            "id",
            postgresql_where=text("group_id IS NULL"),
        ),
    )


app = Outbox(settings=Settings(rescue_interval=0.5))
_client = httpx.Client(timeout=30)

OPTIONS: dict[str, Any] = dict(
    batch_size=BATCH_SIZE,
    # One account per call: its per-account limit is then one key's, and a call the API
    # throttles for an account is that account's records only.
    group_by="account_id",
    urgency=outbox.Urgency.MINUTES,
    retry=RETRY,
    rate_limit=[RateLimit(calls=FLEET_CALLS), RateLimit(calls=ACCOUNT_CALLS, key="account_id")],
    bisect=True,
    circuit_breaker=BREAKER,
)


def records(events: Sequence[AccountActivityEvent]) -> dict[str, Any]:
    """The request body: the API's records."""
    return {
        "records": [
            {
                "id": event.ref,
                "account_id": event.account_id,
                "email": None if event.kind == "no_email" else f"{event.ref}@example.com",
                "kind": event.kind,
            }
            for event in events
        ]
    }


def api_url(events: Sequence[AccountActivityEvent]) -> str:
    """The bulk endpoint, read when a call is made (the test starts the API after the import)."""
    return os.environ[URL_ENV] + BULK_PATH


def sync_accounts(batch: Batch[AccountActivityEvent]) -> None:
    """One bulk call per group; the group id is the idempotency key."""
    response = _client.post(
        api_url(batch.events),
        json=records(batch.events),
        headers={"Idempotency-Key": str(batch.group_id)},
    )
    if response.status_code in (429, 503):
        reason = f"{response.status_code} from the API"
        raise outbox.RetryAfter(response.headers.get("Retry-After", "1"), reason=reason)
    if response.status_code == 400:
        raise outbox.DataError(f"{REFUSED_WHOLE}: {response.json()['error']}")
    response.raise_for_status()
    by_ref = {event.ref: event for event in batch.events}
    rejected: defaultdict[str, list[AccountActivityEvent]] = defaultdict(list)
    result: dict[str, Any]
    for result in response.json()["results"]:
        event = by_ref[result["id"]]
        if result["status"] == 422:
            rejected[result["reason"]].append(event)
        elif result["status"] == 429:
            batch.retry([event], "429 for this account", after=result["retry_after"])
    for reason, events in rejected.items():
        batch.discard(events, reason)


if os.environ.get(HANDLER_ENV) == "sink":
    app.handler(AccountActivityEvent, name="sync_accounts", **OPTIONS)(
        BulkHTTPSink(api_url, allowed_hosts=["127.0.0.1"], body=records, result=StatusList())
    )
else:
    app.handler(AccountActivityEvent, **OPTIONS)(sync_accounts)
