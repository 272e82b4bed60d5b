"""A handler's shared rate limit: reserve a call's turn before the handler is called.

The limits' state is in ``outbox_rate_limits`` (the generic cell rate algorithm, see
``queries.reserve``): every worker of the fleet reserves against the same rows, one after the
other, so together they never exceed the limit. A call whose turn is near is held by its
worker until then; one whose turn is further off than ``max_wait`` reserves nothing, and its
group goes back to wait that long.
"""

from __future__ import annotations

from typing import Any

from outbox._db import queries, run_in_transaction
from outbox.app import Handler, Outbox
from outbox.ratelimit import RateLimit

CALLS, EVENTS = "calls", "events"
# The longest a worker holds a group waiting for its turn: its lease is renewed every third of
# it, and a thread waiting longer is better spent on other handlers' work.
MAX_WAIT_SECONDS = 10.0


def max_wait(app: Outbox) -> float:
    """How long a worker may hold a group waiting for its turn."""
    return min(app.settings.lease_seconds / 3, MAX_WAIT_SECONDS)


def reserve(app: Outbox, handler: Handler[Any], limit: RateLimit, events: int) -> float:
    """Reserve the handler's next call, of ``events`` events: seconds until it may start
    (reserved when at most :func:`max_wait`; otherwise nothing is reserved)."""
    spends = spends_of(limit, events)
    return run_in_transaction(
        app.engine,
        lambda conn: queries.reserve(
            conn, app.dialect, handler.name, spends, max_wait=max_wait(app)
        ),
    )


def spends_of(limit: RateLimit, events: int) -> list[queries.Spend]:
    """What a call of ``events`` events spends of each of the limit's rates."""
    spends = []
    if limit.calls_per_second is not None:
        interval = 1 / limit.calls_per_second
        spends.append(queries.Spend(CALLS, 1, interval, (limit.burst - 1) * interval))
    if limit.events_per_second is not None:
        interval = 1 / limit.events_per_second
        spends.append(queries.Spend(EVENTS, events, interval, (limit.event_burst - 1) * interval))
    return spends
