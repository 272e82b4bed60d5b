"""A handler's shared rate limit: reserve a call's turn before the handler is called.

The limits' state is in ``outbox_rate_limits`` (the generic cell rate algorithm, see
``queries.reserve``): every worker of the fleet reserves against the same rows, one after the
other, so together they never exceed the limit. A call whose turn is near is held by its
worker until then; one whose turn is further off than ``max_wait`` reserves nothing, and its
group goes back to wait that long.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection

from outbox._db import queries, run_in_transaction
from outbox.app import Handler, Outbox
from outbox.ratelimit import RateLimit

CALLS, EVENTS = "calls", "events"
# A key's value, as text, in the name of its limit (``outbox_rate_limits.key``).
KEY_TEXT_LIMIT = 180
# The longest a worker holds a group waiting for its turn: its lease is renewed every third of
# it, and a thread waiting longer is better spent on other handlers' work.
MAX_WAIT_SECONDS = 10.0


def max_wait(app: Outbox) -> float:
    """How long a worker may hold a group waiting for its turn."""
    return min(app.settings.lease_seconds / 3, MAX_WAIT_SECONDS)


def reserve(
    app: Outbox, handler: Handler[Any], limit: RateLimit, events: Mapping[Any, int]
) -> float:
    """Reserve the handler's next call: seconds until it may start (reserved when at most
    :func:`max_wait`; otherwise nothing is reserved). ``events``: the call's events by key
    (``rate_limit_key``'s values: each key has a limit of its own), or ``{None: n}``."""
    spends = [spend for key, n in events.items() for spend in spends_of(limit, n, key)]
    return run_in_transaction(
        app.engine,
        lambda conn: queries.reserve(
            conn, app.dialect, handler.name, spends, max_wait=max_wait(app)
        ),
    )


def hold_back(
    conn: Connection, app: Outbox, handler: Handler[Any], keys: Iterable[Any], seconds: float
) -> None:
    """Let no call of these keys (``rate_limit_key``'s values) start for ``seconds``: their
    limits are pushed back, while other keys' calls go on."""
    assert handler.rate_limit is not None
    spends = [spend for key in set(keys) for spend in spends_of(handler.rate_limit, 0, key)]
    queries.hold_back(conn, app.dialect, handler.name, spends, seconds)


def spends_of(limit: RateLimit, events: int, key: Any = None) -> list[queries.Spend]:
    """What a call of ``events`` events spends of each of the limit's rates (of one key's
    limit, when ``key`` is not None)."""
    suffix = "" if key is None else ":" + str(key)[:KEY_TEXT_LIMIT]
    spends = []
    if limit.calls_per_second is not None:
        interval = 1 / limit.calls_per_second
        spends.append(queries.Spend(CALLS + suffix, 1, interval, (limit.burst - 1) * interval))
    if limit.events_per_second is not None:
        interval = 1 / limit.events_per_second
        tolerance = (limit.event_burst - 1) * interval
        spends.append(queries.Spend(EVENTS + suffix, events, interval, tolerance))
    return spends
