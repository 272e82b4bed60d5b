"""Distribution once: the claim jobs each handler needs, enqueued in one short transaction per
handler (what ``outbox distribute`` runs from cron, and a fleet's leader runs when due).

How many claim jobs a handler needs, and why overlapping runs are safe, is the distributor's
(``outbox._engine.distributor``); this module is where a face asks for a run.
"""

from __future__ import annotations

from outbox._engine import distributor
from outbox._engine.distributor import Distribution
from outbox.app import Outbox

__all__ = ["Distribution", "distribute"]


def distribute(
    app: Outbox, handlers: tuple[str, ...] | list[str] = (), *, patience: float = 0.0
) -> list[Distribution]:
    """Enqueue the claim jobs every handler (or the named ones) needs; what each one did.

    ``patience``: seconds to keep retrying through a database outage before giving up. A
    buffer table that does not exist raises BufferTableMissingError.
    """
    return distributor.run_once(app, handlers, patience=patience)
