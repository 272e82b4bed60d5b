"""A local stand-in for a fulfilment service's bulk API: a small Flask application.

``POST /v1/orders/bulk`` with ``{"records": [{"order_id": ..., "country": ..., ...}, ...]}``:

- while the service is down (``Ledger.unavailable_calls`` > 0, one fewer per call): ``503``,
  nothing is taken;
- more than 500 records: ``413``, nothing is taken;
- an ``Idempotency-Key`` already answered: the same answer again, nothing is taken twice;
- otherwise ``200`` with ``{"accepted": n, "errors": [{"order_id", "reason"}]}``: every record
  is taken but those to a country the service does not deliver to (``AQ``), refused for good.

``GET /v1/orders/received`` shows what it got: every record taken, in arrival order, every
per-record error it answered, and every call. Run it with
``flask --app examples.flask_orders.fake_fulfilment run --port 8027``, or in a test::

    ledger = Ledger()
    with serve(create_app(ledger)) as url:
        ...  # ledger.received, ledger.calls
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from flask import Flask, request
from werkzeug.serving import make_server

BULK_PATH = "/v1/orders/bulk"
RECEIVED_PATH = "/v1/orders/received"
MAX_RECORDS = 500
UNDELIVERABLE_COUNTRIES = frozenset({"AQ"})
HOST = "127.0.0.1"
SHUTDOWN_POLL_SECONDS = 0.05  # how soon serve() notices that it is to stop


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the bulk endpoint, as the service saw it."""

    idempotency_key: str | None
    records: int
    status: int


@dataclass
class Ledger:
    """What the service took, refused and answered; shared by its request threads."""

    unavailable_calls: int = 0
    """How many calls from now on are answered ``503``, as by a service that is down."""
    received: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, key: str | None, records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        """Decide one call: ``(status, body)``; record what was taken."""
        with self.lock:
            status, body = self._decide(key, records)
            self.calls.append(Call(key, len(records), status))
            return status, body

    def _decide(self, key: str | None, records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        if self.unavailable_calls > 0:
            self.unavailable_calls -= 1
            return 503, {"error": "service unavailable"}
        if key is not None and key in self.answers:
            return 200, self.answers[key]
        if len(records) > MAX_RECORDS:
            return 413, {"error": f"at most {MAX_RECORDS} records per call"}
        errors = []
        for record in records:
            if record["country"] in UNDELIVERABLE_COUNTRIES:
                reason = f"no delivery to {record['country']}"
                errors.append({"order_id": record["order_id"], "reason": reason})
            else:
                self.received.append(record)
        self.errors.extend(errors)
        answer = {"accepted": len(records) - len(errors), "errors": errors}
        if key is not None:
            self.answers[key] = answer
        return 200, answer

    def snapshot(self) -> dict[str, Any]:
        """Records taken, errors answered and calls, as ``GET /v1/orders/received`` shows them."""
        with self.lock:
            return {
                "records": list(self.received),
                "errors": list(self.errors),
                "calls": [asdict(call) for call in self.calls],
            }


def create_app(ledger: Ledger | None = None) -> Flask:
    """The fake service, keeping its books in ``ledger`` (a fresh one by default)."""
    books = ledger if ledger is not None else Ledger()
    app = Flask(__name__)

    @app.post(BULK_PATH)
    def bulk() -> tuple[dict[str, Any], int]:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("records"), list):
            return {"error": 'expected {"records": [...]}'}, 400
        status, answer = books.take(request.headers.get("Idempotency-Key"), body["records"])
        return answer, status

    @app.get(RECEIVED_PATH)
    def received() -> dict[str, Any]:
        return books.snapshot()

    return app


@contextmanager
def serve(app: Flask) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 in a thread; yields its base URL."""
    server = make_server(HOST, 0, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
        name="fake-fulfilment",
        daemon=True,
    )
    thread.start()
    try:
        yield f"http://{HOST}:{server.port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
