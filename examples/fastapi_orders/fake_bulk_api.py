"""A local stand-in for a fulfilment service's bulk API: a small Starlette app for uvicorn.

``POST /v1/orders/bulk`` with ``{"records": [{"order_id": ..., "country": ..., ...}, ...]}``:

- more than 500 records: ``413``, nothing is taken;
- an ``Idempotency-Key`` already answered: the same answer again, nothing is taken twice;
- otherwise ``200`` with ``{"accepted": n, "errors": [{"order_id", "reason", "retryable"}]}``.
  Every record is taken except: one to a country the service does not deliver to (``AQ``),
  refused for good (``retryable: false``); and, with ``FAKE_BULK_API_BUSY_EVERY=n``, every n-th
  record seen for the first time, refused for now ("warehouse busy", ``retryable: true``) and
  taken when it comes again.

``GET /v1/orders/received`` shows what it got: every record taken, in arrival order, every
per-record error it answered, and every call. Run it with
``uvicorn examples.fastapi_orders.fake_bulk_api:app --port 8026``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

BULK_PATH = "/v1/orders/bulk"
RECEIVED_PATH = "/v1/orders/received"
MAX_RECORDS = 500
BUSY_EVERY_ENV = "FAKE_BULK_API_BUSY_EVERY"
UNDELIVERABLE_COUNTRIES = frozenset({"AQ"})


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the bulk endpoint, as the service saw it."""

    idempotency_key: str | None
    records: int
    status: int


@dataclass
class Ledger:
    """What the service took, refused and answered. One event loop: no lock is needed."""

    busy_every: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def take(self, key: str | None, records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        """Decide one call: ``(status, body)``; record what was taken."""
        status, body = self._decide(key, records)
        self.calls.append(Call(key, len(records), status))
        return status, body

    def _decide(self, key: str | None, records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        if key is not None and key in self.answers:
            return 200, self.answers[key]
        if len(records) > MAX_RECORDS:
            return 413, {"error": f"at most {MAX_RECORDS} records per call"}
        errors = []
        for record in records:
            error = self._refusal(record)
            if error is None:
                self.received.append(record)
            else:
                errors.append(error)
        self.errors.extend(errors)
        answer = {"accepted": len(records) - len(errors), "errors": errors}
        if key is not None:
            self.answers[key] = answer
        return 200, answer

    def _refusal(self, record: dict[str, Any]) -> dict[str, Any] | None:
        order_id = record["order_id"]
        if record["country"] in UNDELIVERABLE_COUNTRIES:
            reason = f"no delivery to {record['country']}"
            return {"order_id": order_id, "reason": reason, "retryable": False}
        first_sight = order_id not in self.seen
        self.seen.add(order_id)
        if first_sight and self.busy_every and len(self.seen) % self.busy_every == 0:
            return {"order_id": order_id, "reason": "warehouse busy", "retryable": True}
        return None


def create_app(busy_every: int = 0) -> Starlette:
    """The fake service, with a fresh ledger."""
    ledger = Ledger(busy_every=busy_every)

    async def bulk(request: Request) -> JSONResponse:
        try:
            records = (await request.json())["records"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'expected {"records": [...]}'}, status_code=400)
        status, body = ledger.take(request.headers.get("Idempotency-Key"), records)
        return JSONResponse(body, status_code=status)

    async def received(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "records": ledger.received,
                "errors": ledger.errors,
                "calls": [asdict(call) for call in ledger.calls],
            }
        )

    return Starlette(
        routes=[
            Route(BULK_PATH, bulk, methods=["POST"]),
            Route(RECEIVED_PATH, received, methods=["GET"]),
        ]
    )


app = create_app(busy_every=int(os.environ.get(BUSY_EVERY_ENV, "0")))
