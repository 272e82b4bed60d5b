"""A handler's shared rate limits: reserve a call's turn before the handler is called.

The limits' state is in ``outbox_rate_limits`` (a sliding window of recent starts per limit, see
``queries.reserve``): every worker of the fleet reserves against the same rows, one after the
other, so together they never exceed a limit in any window. A call whose turn is near is held
by its worker until then; one whose turn is further off than ``max_wait`` reserves nothing, and
its group goes back to wait that long.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.handler import Handler
from outbox.ratelimit import MARGIN_SECONDS, RateLimit, Unit, Window

# A key's value, as text, in the name of its limit (``outbox_rate_limits.key``, 200 characters).
KEY_NAME_LIMIT = 200
# The longest a worker holds a group waiting for its turn: its lease is renewed every third of
# it, and a thread waiting longer is better spent on other handlers' work.
MAX_WAIT_SECONDS = 10.0
# Reservations a call makes before giving up when it keeps starting later than the margin
# allows (a starved machine): its group goes back for a while instead.
MAX_TRIES = 3
LATE_RETRY_SECONDS = 1.0


def max_wait(app: Outbox) -> float:
    """How long a worker may hold a group waiting for its turn."""
    return min(app.settings.lease_seconds / 3, MAX_WAIT_SECONDS)


def key_columns(handler: Handler[Any]) -> list[str]:
    """The buffer columns the handler's per-key limits apply to."""
    return sorted({limit.key for limit in handler.rate_limits if limit.key is not None})


def take_turn(
    app: Outbox, handler: Handler[Any], events: int, keys: Mapping[str, Sequence[str | None]]
) -> float | None:
    """Reserve the call of a group of ``events`` events under every limit of the handler
    (``keys``: its events' values of each of :func:`key_columns`) and wait for its turn: None
    once the handler may be called, or the seconds the group must go back for, when its turn
    is further off than a worker waits.

    A call starts no earlier than reserved. It may start later (the commit, the wake-up); a
    worker later than :data:`MARGIN_SECONDS` reserves again, as its reserved start no longer
    says where its call falls in the windows."""
    spends = spends_of(handler, events, keys)
    for _ in range(MAX_TRIES):
        turn = run_in_transaction(
            app.engine,
            lambda conn: queries.reserve(
                conn, app.dialect, handler.name, spends, max_wait=max_wait(app)
            ),
        )
        if not turn.reserved:
            return turn.wait
        # From after the clock was read: never before the reserved start.
        delay = turn.told_at + turn.wait - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if time.monotonic() - (turn.asked_at + turn.wait) <= MARGIN_SECONDS:
            return None
    return LATE_RETRY_SECONDS


def hold_back(
    conn: Connection, app: Outbox, handler: Handler[Any], keys: Iterable[Any], seconds: float
) -> None:
    """Let no call of these keys (``(column, value)`` pairs of the handler's per-key limits)
    start for ``seconds``: their limits are pushed back, while other keys' calls go on."""
    pairs = set(keys)
    names = [
        row_name(window, limit.key, value)
        for limit in handler.rate_limits
        if limit.key is not None
        for column, value in pairs
        if column == limit.key
        for window in limit.windows()
    ]
    queries.hold_back(conn, app.dialect, handler.name, names, seconds)


def spends_of(
    handler: Handler[Any], events: int, keys: Mapping[str, Sequence[str | None]]
) -> list[queries.Spend]:
    """What a call of ``events`` events spends of each of the handler's limits: a fleet-wide
    limit once, a per-key limit once for each key among its events (a call, and that key's
    events)."""
    spends = []
    for limit in handler.rate_limits:
        counts = _counts(limit, events, keys)
        for value, count in counts.items():
            for window in limit.windows():
                cost = 1 if window.unit is Unit.CALLS else count
                span = window.period + (MARGIN_SECONDS if window.exact else 0.0)
                name = row_name(window, limit.key, value)
                spends.append(
                    queries.Spend(name, cost, window.capacity, span, limit.key is not None)
                )
    return spends


def _counts(
    limit: RateLimit, events: int, keys: Mapping[str, Sequence[str | None]]
) -> Mapping[str | None, int]:
    if limit.key is None:
        return {None: events}
    return Counter(keys[limit.key])


def row_name(window: Window, column: str | None, value: str | None) -> str:
    """The name of a window's row (``outbox_rate_limits.key``): its unit, its period unless a
    second, ``~`` for a burst's spacing, and for a per-key limit the column and the value
    (``calls``, ``events/60s``, ``calls@account_id:42``)."""
    name = str(window.unit)
    if window.period != 1:
        name += f"/{window.period:g}s"
    if not window.exact:
        name += "~"
    if column is not None:
        name += f"@{column}:"
        name += str(value)[: max(KEY_NAME_LIMIT - len(name), 0)]
    return name
