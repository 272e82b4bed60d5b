"""An application that declares two inboxes and no handler, for ``outbox inbox`` and
``outbox status``: ``outbox --app tests.acceptance.inbox_app:app ...``."""

from __future__ import annotations

from outbox import Outbox

app = Outbox()
orders = app.inbox("orders", horizon=3600)
refunds = app.inbox("refunds")
