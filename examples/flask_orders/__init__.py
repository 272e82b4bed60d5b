"""Flask orders: an app factory with Flask-SQLAlchemy; a view writes orders and their events.

``create_app(config)`` builds the application: Flask-SQLAlchemy's ``db`` bound to it, its
``Outbox`` on the same engine (``outbox_ext.init_outbox``), the ``POST /orders`` view, and the
``flask init-db`` command. Run it with ``flask --app examples.flask_orders run``; the worker is
``outbox --app examples.flask_orders.worker:outbox work`` (``worker.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from flask import Flask
from sqlalchemy import select

from examples.flask_orders.models import Product, db
from examples.flask_orders.outbox_ext import init_outbox
from examples.flask_orders.shipping import (
    DEFAULT_FULFILMENT_API_URL,
    DEFAULT_RETRY,
    DEFAULT_TIMEOUT_SECONDS,
    register_handlers,
)
from examples.flask_orders.views import orders

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'flask_orders.sqlite3'}"
# "signed-print" has one left: the second order of it is refused, and rolled back.
CATALOGUE = {"mug": 1_000_000, "poster": 1_000_000, "signed-print": 1}


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The application: defaults, then ``FLASK_*`` environment variables, then ``config``.

    ``FLASK_SQLALCHEMY_DATABASE_URI`` names the database (default: a SQLite file next to this
    package), ``FLASK_FULFILMENT_API_URL`` the fulfilment service. The web processes and the
    worker read the same variables, so they share one database, as they must: the events are
    written in the application's own transactions.
    """
    app = Flask(__name__)
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI=DEFAULT_DATABASE_URL,
        FULFILMENT_API_URL=DEFAULT_FULFILMENT_API_URL,
        FULFILMENT_TIMEOUT_SECONDS=DEFAULT_TIMEOUT_SECONDS,
        FULFILMENT_RETRY=DEFAULT_RETRY,
    )
    app.config.from_prefixed_env()
    if config is not None:
        app.config.from_mapping(config)
    db.init_app(app)
    init_outbox(app, register_handlers)
    app.register_blueprint(orders)
    app.cli.add_command(init_db_command)
    return app


def init_db() -> None:
    """Create the application's tables (the buffer among them) and the catalogue, where missing.

    Needs an application context. outbox's own tables are not among them: ``outbox migrate``
    creates those. In production the application's migrations own its tables.
    """
    db.create_all()
    existing = set(db.session.scalars(select(Product.sku)))
    db.session.add_all(
        Product(sku=sku, stock=stock) for sku, stock in CATALOGUE.items() if sku not in existing
    )
    db.session.commit()


@click.command("init-db")
def init_db_command() -> None:
    """Create the shop's tables and catalogue: ``flask --app examples.flask_orders init-db``."""
    init_db()
    click.echo("created the tables and the catalogue")
