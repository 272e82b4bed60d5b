"""Shipments fanned out to a search index and, added later, a partner feed, for ``outbox
fanout`` and ``outbox status``: ``outbox --app tests.acceptance.fanout_app:app ...``. The
fan-out archives, so the partner can start from the events it keeps."""

from __future__ import annotations

from typing import Any

from outbox import Batch, Outbox
from tests.models import ShipmentEvent, ShipmentPartner, ShipmentSearch


def handle(batch: Batch[Any]) -> None:
    """A consumer's handler: the tests look at the buffers, not at what it did."""


def shipments(app: Outbox, *consumers: type[Any]) -> Outbox:
    """``app`` fanning the shipments out to ``consumers``, each drained by a handler named for
    the last word of its table (``search``, ``partner``)."""
    app.fanout(ShipmentEvent, to=consumers, archive=True)
    for model in consumers:
        app.handler(model, name=model.__tablename__.rsplit("_", 1)[-1])(handle)
    return app


app = shipments(Outbox(), ShipmentSearch, ShipmentPartner)
