"""The FastAPI example end to end, as its README runs it: three real processes.

uvicorn serves the orders application and the fake fulfilment API; ``outbox work`` runs beside
them. Orders are placed over HTTP (one by one, many at once, in bulk, and some that stock
refuses); the worker ships them; then every process is stopped with SIGTERM. That run happens
once per database (a module-scoped fixture); the tests read its outcome from the fake API, the
processes' logs and the database.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from examples.fastapi_orders.models import Order, OrderPlaced
from outbox import schema
from tests._ports import free_ports
from tests._support import wait_for
from tests.acceptance._cli import OUTBOX, ROOT

OUTBOX_APP = "examples.fastapi_orders.outbox_app:outbox"
WEB_APP = "examples.fastapi_orders.app:app"
FAKE_API = "examples.fastapi_orders.fake_bulk_api:app"
RECEIVED = "/v1/orders/received"

ONE_BY_ONE = 30
AT_ONCE = 60
BULK = (200, 150)
UNDELIVERABLE_EVERY = 10  # every 10th order goes to Antarctica, where the service never delivers
BUSY_EVERY = 7  # the fake API refuses every 7th new record once: "warehouse busy", retryable
REFUSED = "refused"  # the customer name of the orders that stock refuses

STARTUP_TIMEOUT_SECONDS = 30.0
# The busy records come back after the handler's first backoff, about 2 s.
DELIVERY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0


class Process:
    """A server started by the test; stdout and stderr go to one log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    def output(self) -> str:
        """What it printed so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        """Still running; fails the test with its output if it ended."""
        code = self.popen.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited {code}:\n{self.output()}")
        return True

    def stop(self) -> int:
        """SIGTERM, then its exit code (negative: ended by that signal)."""
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=STOP_TIMEOUT_SECONDS)

    def kill(self) -> None:
        """Kill it if it is still running."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=STOP_TIMEOUT_SECONDS)


def _uvicorn(name: str, app: str, port: int, env: dict[str, str], log: Path) -> Process:
    """``uvicorn app`` on 127.0.0.1:``port``, as the README starts it."""
    args = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    return Process(name, args, env, log)


def _wait_until_serving(process: Process, url: str) -> None:
    """Poll ``url`` until it answers 200 (uvicorn answers once the lifespan has started)."""

    def answers() -> bool:
        process.alive()
        try:
            return httpx.get(url).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, f"{process.name} to answer", STARTUP_TIMEOUT_SECONDS)


# --- the orders the run places -----------------------------------------------------------------


def _order(n: int, customer: str | None = None, sku: str | None = None) -> dict[str, Any]:
    return {
        "customer": customer or f"customer-{n}",
        "sku": sku or ("mug", "poster")[n % 2],
        "quantity": 1 if sku == "signed-print" else n % 3 + 1,
        "country": "AQ" if n % UNDELIVERABLE_EVERY == 0 else ("DE", "FR", "NL", "ES")[n % 4],
    }


def _written(order: dict[str, Any], response: httpx.Response) -> dict[str, Any]:
    """The record the fulfilment service must receive for an order the application wrote."""
    assert 201 == response.status_code, response.text
    return {"order_id": response.json()["order_id"], **order}


async def _place_at_once(base_url: str, orders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as client:
        responses = await asyncio.gather(*(client.post("/orders", json=o) for o in orders))
    return [_written(o, r) for o, r in zip(orders, responses, strict=True)]


@dataclass(frozen=True)
class Placed:
    """The orders placed over HTTP: those written, and the answers to those refused."""

    written: list[dict[str, Any]]
    refused: list[int]
    """The status codes of the requests that stock refused."""


def place_orders(base_url: str) -> Placed:
    """One by one, many at once, in bulk, and two requests (one of each kind) that stock refuses."""
    orders = iter(range(1, 1_000_000))
    written = []
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        # The catalogue holds one signed print: the first order of it takes it.
        for n in range(ONE_BY_ONE):
            order = _order(next(orders), sku="signed-print" if n == 0 else None)
            written.append(_written(order, client.post("/orders", json=order)))
        refused = [client.post("/orders", json=_order(0, REFUSED, "signed-print")).status_code]
        written += asyncio.run(
            _place_at_once(base_url, [_order(next(orders)) for _ in range(AT_ONCE)])
        )
        for size in BULK:
            bulk = [_order(next(orders)) for _ in range(size)]
            response = client.post("/orders/bulk", json={"orders": bulk})
            assert 201 == response.status_code, response.text
            ids = response.json()["order_ids"]
            written += [{"order_id": i, **o} for i, o in zip(ids, bulk, strict=True)]
        # A bulk request with one order out of stock: none of its orders or events is kept.
        bulk = [_order(n, REFUSED) for n in range(5)] + [_order(5, REFUSED, "signed-print")]
        refused.append(client.post("/orders/bulk", json={"orders": bulk}).status_code)
    return Placed(written=written, refused=refused)


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One run of the example and what the fake API, the processes and the database saw."""

    placed: Placed
    received: dict[str, Any]
    """What ``GET /v1/orders/received`` answered: records, errors, calls."""
    exit_codes: dict[str, int]
    logs: dict[str, str]
    orders_in_database: set[str]
    events_left: int
    archived: list[dict[str, Any]]


@pytest.fixture(scope="module")
def empty_postgres_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database with no tables at all, on the test session's server; dropped after.

    Empty, not merely reset: ``outbox migrate`` must find no outbox table it did not create.
    """
    name = f"outbox_fastapi_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _urls(request: pytest.FixtureRequest, tmp: Path) -> tuple[str, str]:
    """(the application's async URL, a sync URL for the test) on an empty database."""
    if request.param == "sqlite":
        path = tmp / "orders.sqlite3"
        return f"sqlite+aiosqlite:///{path}", f"sqlite:///{path}"
    url: str = request.getfixturevalue("empty_postgres_url")
    asynchronous = make_url(url).set(drivername="postgresql+asyncpg")
    return asynchronous.render_as_string(hide_password=False), url


def _delivered(api_url: str, expected: set[str]) -> bool:
    """Every written order was taken by the API or refused for good."""
    seen = httpx.get(api_url + RECEIVED).json()
    taken = {record["order_id"] for record in seen["records"]}
    final = {error["order_id"] for error in seen["errors"] if not error["retryable"]}
    return expected <= taken | final


def _settled(sync_url: str, discarded: int) -> bool:
    """The buffer is empty and the discarded events are in the archive."""
    engine = create_engine(sync_url)
    try:
        with engine.connect() as conn:
            left = conn.scalar(select(func.count()).select_from(OrderPlaced))
            archived = conn.scalar(select(func.count()).select_from(schema.archive))
    finally:
        engine.dispose()
    return (0, discarded) == (left, archived)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Start the three processes, place the orders, wait until all arrived, stop everything."""
    tmp = tmp_path_factory.mktemp("fastapi_orders")
    database_url, sync_url = _urls(request, tmp)
    port = free_ports(2)
    web_url, api_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(
        PYTHONUNBUFFERED="1",
        DATABASE_URL=database_url,
        FULFILMENT_API_URL=api_url,
        FAKE_BULK_API_BUSY_EVERY=str(BUSY_EVERY),
    )
    processes: dict[str, Process] = {}
    try:
        processes["fake_api"] = _uvicorn("fake API", FAKE_API, port + 1, env, tmp / "api.log")
        processes["web"] = _uvicorn("web application", WEB_APP, port, env, tmp / "web.log")
        _wait_until_serving(processes["fake_api"], api_url + RECEIVED)
        _wait_until_serving(processes["web"], web_url + "/health")
        migrated = subprocess.run(
            [str(OUTBOX), "--app", OUTBOX_APP, "migrate"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=STARTUP_TIMEOUT_SECONDS,
            check=False,
        )
        assert 0 == migrated.returncode, migrated.stderr
        work = [
            str(OUTBOX),
            "--app",
            OUTBOX_APP,
            "work",
            "--distribute-every",
            "0.2",
            "--poll-interval",
            "0.2",
        ]
        processes["worker"] = Process("outbox work", work, env, tmp / "worker.log")

        placed = place_orders(web_url)

        expected = {record["order_id"] for record in placed.written}
        discarded = sum(record["country"] == "AQ" for record in placed.written)
        wait_for(
            lambda: processes["worker"].alive() and _delivered(api_url, expected),
            "every order to be delivered",
            DELIVERY_TIMEOUT_SECONDS,
        )
        wait_for(
            lambda: _settled(sync_url, discarded), "the buffer to drain", DELIVERY_TIMEOUT_SECONDS
        )
        received = httpx.get(api_url + RECEIVED).json()
        # The worker first: it stops while the API still answers.
        exit_codes = {name: processes[name].stop() for name in ("worker", "web", "fake_api")}
        logs = {name: process.output() for name, process in processes.items()}
    finally:
        for process in processes.values():
            process.kill()
    engine = create_engine(sync_url)
    try:
        with engine.connect() as conn:
            orders = {str(i) for i in conn.scalars(select(Order.id))}
            events_left = conn.scalar(select(func.count()).select_from(OrderPlaced)) or 0
            archived = [dict(row._mapping) for row in conn.execute(select(schema.archive))]
    finally:
        engine.dispose()
    return Run(placed, received, exit_codes, logs, orders, events_left, archived)


# --- the tests -----------------------------------------------------------------------------------


def test_every_deliverable_order_arrives_once_as_written(run: Run) -> None:
    """The API received each committed order once, with the fields the client posted."""
    deliverable = [r for r in run.placed.written if r["country"] != "AQ"]
    key = "order_id"
    assert sorted(deliverable, key=lambda r: r[key]) == sorted(
        run.received["records"], key=lambda r: r[key]
    )


def test_orders_are_sent_in_bulk(run: Run) -> None:
    """Far fewer calls than orders, none over the API's 500 records."""
    calls = run.received["calls"]
    assert {200} == {call["status"] for call in calls}
    assert max(call["records"] for call in calls) <= 500
    assert len(calls) < len(run.placed.written) / 5


def test_busy_records_are_retried_until_taken(run: Run) -> None:
    """Records the API refused for now were retried by ``batch.retry`` and then taken."""
    busy = {e["order_id"] for e in run.received["errors"] if e["retryable"]}
    taken = {record["order_id"] for record in run.received["records"]}
    assert busy  # the run has some, or this test proves nothing
    assert busy <= taken


def test_undeliverable_orders_are_archived_as_discarded(run: Run) -> None:
    """Orders to a country the API refuses for good end in the archive with the API's reason."""
    undeliverable = {r["order_id"] for r in run.placed.written if r["country"] == "AQ"}
    # SQLite keeps a UUID as 32 hex digits, PostgreSQL's JSON with dashes: compare as UUIDs.
    archived = {str(uuid.UUID(row["payload"]["order_id"])): row for row in run.archived}
    assert undeliverable == set(archived)
    assert {("discarded", "no delivery to AQ")} == {
        (r["status"], r["error"]) for r in archived.values()
    }


def test_refused_requests_leave_no_order_and_deliver_no_event(run: Run) -> None:
    """Requests that stock refused after writing their events were rolled back whole."""
    assert [409, 409] == run.placed.refused
    assert {r["order_id"] for r in run.placed.written} == run.orders_in_database
    assert [] == [r for r in run.received["records"] if r["customer"] == REFUSED]
    assert 0 == run.events_left


def test_worker_stops_cleanly_on_sigterm(run: Run) -> None:
    """``outbox work`` exits 0 on SIGTERM, having logged nothing at error level."""
    assert 0 == run.exit_codes["worker"], run.logs["worker"]
    assert '"level": "error"' not in run.logs["worker"]


def test_uvicorn_servers_shut_down_gracefully_on_sigterm(run: Run) -> None:
    """Both servers finish their shutdown (lifespan included) on SIGTERM.

    uvicorn re-raises the SIGTERM it handled once it has shut down, so that its parent sees how
    it ended: "ended by SIGTERM" after a complete, graceful shutdown (0 before uvicorn 0.29).
    """
    for name in ("web", "fake_api"):
        assert run.exit_codes[name] in {0, -signal.SIGTERM}, run.logs[name]
        assert "Application shutdown complete." in run.logs[name]
        assert "Traceback" not in run.logs[name]
