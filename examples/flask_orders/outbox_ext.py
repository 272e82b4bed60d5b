"""outbox in an app factory: one ``Outbox`` per Flask application, on its Flask-SQLAlchemy engine.

With an app factory there is no engine at import time: Flask-SQLAlchemy makes one per
application in ``db.init_app(app)``. So the ``Outbox`` is made there too, like any extension's
state: ``init_outbox(app, register)`` builds ``Outbox(engine=db.engine)`` inside the
application's context, lets ``register`` add the handlers (whose options may come from the
application's config), and keeps it in ``app.extensions``, where ``outbox_of(app)`` finds it.
Every application has its own, so two applications in one process (two tests, two databases)
never share one.

Handlers run in outbox's worker threads, outside any request and any application context.
``in_app_context(app, handler)`` runs each call inside ``app.app_context()``, so a handler may use
``current_app.config`` and ``db.session``, as a view does; its session is removed when the call
ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from flask import Flask

from examples.flask_orders.models import db
from outbox import Batch, BufferMixin, Outbox

EXTENSION_KEY = "outbox"
EventT = TypeVar("EventT", bound=BufferMixin)


def init_outbox(app: Flask, register: Callable[[Outbox, Flask], None]) -> Outbox:
    """Build ``app``'s Outbox on its Flask-SQLAlchemy engine; ``register`` adds its handlers.

    Call it after ``db.init_app(app)`` and before the first query: on SQLite, outbox sets up the
    engine's connections as they are made (WAL, a busy timeout, ``BEGIN IMMEDIATE``), and the
    application's own transactions then take the write lock up front too, so that the web
    processes and the worker queue for it instead of failing with "database is locked".
    """
    with app.app_context():
        engine = db.engine
    outbox = Outbox(engine=engine)
    register(outbox, app)
    app.extensions[EXTENSION_KEY] = outbox
    return outbox


def outbox_of(app: Flask) -> Outbox:
    """The Outbox ``init_outbox`` built for ``app``."""
    outbox = app.extensions.get(EXTENSION_KEY)
    if not isinstance(outbox, Outbox):
        raise RuntimeError(f"no Outbox on the Flask application {app.name!r}: call init_outbox")
    return outbox


def in_app_context(
    app: Flask, handler: Callable[[Batch[EventT]], None]
) -> Callable[[Batch[EventT]], None]:
    """``handler``, run inside ``app.app_context()`` on each call; it keeps its name."""

    @functools.wraps(handler)
    def run(batch: Batch[EventT]) -> None:
        with app.app_context():
            handler(batch)

    return run
