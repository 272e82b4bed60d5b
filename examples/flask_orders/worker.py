"""The application's ``Outbox``, for the ``outbox`` command.

``outbox --app`` takes ``module:attribute`` naming an ``Outbox``. With an app factory, none exists
until an application is made, so this module makes one, from the same configuration as the web
processes (``FLASK_*`` environment variables), and names its Outbox::

    outbox --app examples.flask_orders.worker:outbox migrate
    outbox --app examples.flask_orders.worker:outbox work

The worker then runs on the application's own Flask-SQLAlchemy engine, and each handler call
runs inside this application's context.
"""

from __future__ import annotations

from examples.flask_orders import create_app
from examples.flask_orders.outbox_ext import outbox_of

app = create_app()
outbox = outbox_of(app)
