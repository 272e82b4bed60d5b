"""The Flask example, tested as a Flask application's own tests would test it.

Each test builds the application with its factory (``create_app``) on an empty database of each
kind, places orders through Flask's test client, and runs the outbox with
``outbox.testing.drain`` in the application's context, against the fake fulfilment service
served on a local port. Then it reads what the service received, the buffer and the archive.
One more test runs the ``outbox`` command on the application's Outbox, as the README does.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from examples.flask_orders import create_app, init_db
from examples.flask_orders.fake_fulfilment import Ledger, serve
from examples.flask_orders.fake_fulfilment import create_app as create_fake_fulfilment
from examples.flask_orders.models import Order, OrderPlaced, db
from examples.flask_orders.outbox_ext import outbox_of
from outbox import RetryPolicy, schema
from outbox.testing import DrainResult, drain
from tests.acceptance._cli import OUTBOX, ROOT

# Retries due at once: a test that drains sees every attempt of a failing group.
IMMEDIATE_RETRY = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)
DOWN_FOR_GOOD = 1_000
CLI_TIMEOUT_SECONDS = 60.0
WORKER = "examples.flask_orders.worker:outbox"


@dataclass(frozen=True)
class Fulfilment:
    """The fake fulfilment service: where it listens, and its books."""

    url: str
    ledger: Ledger


@pytest.fixture
def fulfilment() -> Iterator[Fulfilment]:
    """The fake fulfilment service on a free local port, with an empty ledger."""
    ledger = Ledger()
    with serve(create_fake_fulfilment(ledger)) as url:
        yield Fulfilment(url, ledger)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of each kind: a fresh SQLite file, or the test session's server database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/orders.sqlite3"
    url: str = request.getfixturevalue(f"{request.param.replace('postgresql', 'postgres')}_url")
    return url


MakeApp = Callable[..., Flask]


@pytest.fixture
def make_app(database: str, fulfilment: Fulfilment) -> Iterator[MakeApp]:
    """Build the application with its factory, on empty tables: its own (and the catalogue),
    and outbox's. Keyword arguments override the test configuration."""
    apps: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = create_app(
            {
                "TESTING": True,
                "SQLALCHEMY_DATABASE_URI": database,
                "FULFILMENT_API_URL": fulfilment.url,
                "FULFILMENT_RETRY": IMMEDIATE_RETRY,
                **config,
            }
        )
        apps.append(app)
        with app.app_context():
            db.drop_all()
            schema.metadata.drop_all(db.engine)
            schema.metadata.create_all(db.engine)
            init_db()
        return app

    yield make
    for app in apps:
        with app.app_context():
            db.engine.dispose()


@pytest.fixture
def app(make_app: MakeApp) -> Flask:
    """The application, retrying failed groups at once."""
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """Flask's test client of the application."""
    return app.test_client()


def _order(n: int, **fields: Any) -> dict[str, Any]:
    return {"customer": f"customer-{n}", "sku": "mug", "quantity": 1, "country": "DE", **fields}


def _place(client: FlaskClient, order: dict[str, Any]) -> dict[str, Any]:
    """Place ``order``; the record the fulfilment service must receive for it."""
    response = client.post("/orders", json=order)
    assert 201 == response.status_code, response.get_data(as_text=True)
    body: dict[str, Any] = response.get_json()
    return body


def _drain(app: Flask) -> DrainResult:
    """Everything due now, through the real code paths, in the application's context."""
    with app.app_context():
        return drain(outbox_of(app))


def _count(app: Flask, model: type[Any]) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(model)) or 0


def _archived(app: Flask) -> list[tuple[str, str]]:
    """(status, error) of each archived event."""
    with app.app_context():
        rows = db.session.execute(select(schema.archive.c.status, schema.archive.c.error))
        return [(status, error) for status, error in rows]


def _by_id(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(records, key=lambda record: record["order_id"])


# --- delivery ----------------------------------------------------------------------------------


def test_placed_orders_reach_the_service_exactly_once(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """Each order placed arrives once, as written; a second drain sends nothing again."""
    placed = [_place(client, _order(n)) for n in range(3)]
    with app.app_context():
        first, second = drain(outbox_of(app)), drain(outbox_of(app))
    assert (3, 0) == (first.stats.events_succeeded, second.jobs)
    assert _by_id(placed) == _by_id(fulfilment.ledger.received)
    assert 0 == _count(app, OrderPlaced)


def test_a_group_goes_in_one_bulk_call(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """Five orders cost one call."""
    for n in range(5):
        _place(client, _order(n))
    _drain(app)
    assert [(5, 200)] == [(call.records, call.status) for call in fulfilment.ledger.calls]


def test_an_order_out_of_stock_leaves_no_event(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """A 409 rolls the event back with the order: the service never hears of it."""
    placed = _place(client, _order(1, sku="signed-print"))
    refused = client.post("/orders", json=_order(2, sku="signed-print"))
    _drain(app)
    assert 409 == refused.status_code
    assert (1, [placed]) == (_count(app, Order), fulfilment.ledger.received)


def test_an_undeliverable_order_is_archived_with_the_reason(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """An order the service refuses for good is discarded; the rest of its group arrives."""
    deliverable = _place(client, _order(1))
    _place(client, _order(2, country="AQ"))
    result = _drain(app)
    assert (1, 1) == (result.stats.events_succeeded, result.stats.events_discarded)
    assert [deliverable] == fulfilment.ledger.received
    assert [("discarded", "no delivery to AQ")] == _archived(app)


def test_the_handler_has_its_application_context_without_the_callers(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """Drained with no context pushed, as a worker runs it, the handler reads ``current_app``."""
    placed = _place(client, _order(1))
    drain(outbox_of(app))
    assert [placed] == fulfilment.ledger.received


# --- failures ------------------------------------------------------------------------------------


def test_an_outage_is_retried_until_the_group_arrives(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """A 503 fails the attempt; the retry (due at once under the test's policy) delivers it."""
    placed = _place(client, _order(1))
    fulfilment.ledger.unavailable_calls = 1
    result = _drain(app)
    assert (1, 1) == (result.stats.groups_retried, result.stats.groups_succeeded)
    assert [503, 200] == [call.status for call in fulfilment.ledger.calls]
    assert [placed] == fulfilment.ledger.received


def test_a_service_down_for_good_dead_letters_the_group(
    app: Flask, client: FlaskClient, fulfilment: Fulfilment
) -> None:
    """After its last attempt the group is archived as dead, with the error it failed with."""
    _place(client, _order(1))
    fulfilment.ledger.unavailable_calls = DOWN_FOR_GOOD
    result = _drain(app)
    [(status, error)] = _archived(app)
    assert (1, IMMEDIATE_RETRY.max_attempts) == (
        result.stats.groups_dead,
        len(fulfilment.ledger.calls),
    )
    assert ("dead", True) == (status, "503" in error)
    assert 0 == _count(app, OrderPlaced)


def test_a_failed_group_waits_for_its_backoff(make_app: MakeApp, fulfilment: Fulfilment) -> None:
    """Under the application's own retry policy, drain leaves the retry for later."""
    app = make_app(FULFILMENT_RETRY=RetryPolicy(max_attempts=3))
    _place(app.test_client(), _order(1))
    fulfilment.ledger.unavailable_calls = 1
    result = _drain(app)
    assert (1, 0) == (result.stats.groups_retried, result.stats.groups_succeeded)
    assert (1, []) == (_count(app, OrderPlaced), fulfilment.ledger.received)


# --- the application factory and the outbox command ------------------------------------------


def test_each_application_has_its_own_outbox_on_its_own_engine(tmp_path: Path) -> None:
    """Two applications from the factory: two Outboxes, each on its application's engine."""
    apps = [
        create_app({"SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp_path}/{name}.sqlite3"})
        for name in ("one", "two")
    ]
    outboxes = [outbox_of(app) for app in apps]
    engines = []
    for app in apps:
        with app.app_context():
            engines.append(db.engine)
    assert outboxes[0] is not outboxes[1]
    assert engines == [o.engine for o in outboxes]
    assert [["ship_orders"]] * 2 == [list(o.handlers) for o in outboxes]


def test_the_outbox_command_runs_the_applications_outbox(
    tmp_path: Path, fulfilment: Fulfilment
) -> None:
    """``outbox --app examples.flask_orders.worker:outbox``: migrate, then work delivers."""
    url = f"sqlite:///{tmp_path}/orders.sqlite3"
    app = create_app({"SQLALCHEMY_DATABASE_URI": url})
    with app.app_context():
        init_db()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "FLASK_"))}
    env.update(FLASK_SQLALCHEMY_DATABASE_URI=url, FLASK_FULFILMENT_API_URL=fulfilment.url)

    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(OUTBOX), "--app", WORKER, *args]
        return subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )

    migrated = outbox("migrate")
    placed = _place(app.test_client(), _order(1))
    worked = outbox("work", "--burst")
    with app.app_context():
        db.engine.dispose()
    assert (0, 0) == (migrated.returncode, worked.returncode), migrated.stderr + worked.stderr
    assert [placed] == fulfilment.ledger.received
