"""Statements on ``outbox_rate_limits``: the fleet's shared rate limits (GCRA)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, delete, select, update

from outbox import schema
from outbox._checks import MAX_WAIT_SECONDS
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus

_limits = schema.rate_limits


@dataclass(frozen=True, slots=True)
class Spend:
    """What one call spends of one limit: ``cost`` units (1 per call, or the events it
    carries) at ``interval`` seconds each, with ``tolerance`` seconds of burst."""

    key: str
    cost: float
    interval: float
    tolerance: float


def reserve(
    conn: Connection, dialect: str, handler: str, spends: Sequence[Spend], *, max_wait: float
) -> float:
    """Reserve a call against a handler's limits: the seconds from now at which it may start
    (0: at once). Nothing is reserved, and the wait is returned as it is, when it is longer
    than ``max_wait``.

    The generic cell rate algorithm: each limit keeps a theoretical arrival time (``tat``); a
    call may start once ``tat - tolerance`` has come, and moves ``tat`` on by its cost. The
    limits' rows are locked (``FOR UPDATE``, in key order; SQLite's transaction holds the write
    lock) until the transaction ends, so that sessions reserving at once are served one after
    the other, each after the other's reservation.
    """
    ahead = _locked(conn, dialect, handler, spends)
    wait = max(max(ahead[s.key] - s.tolerance, 0.0) for s in spends)
    if wait > max_wait:
        return wait
    for spend in spends:
        # From when the call starts: a limit that allowed it sooner is charged from then.
        arrival = min(max(ahead[spend.key], wait) + spend.cost * spend.interval, MAX_WAIT_SECONDS)
        conn.execute(
            update(_limits)
            .where(and_(_limits.c.handler == handler, _limits.c.key == spend.key))
            .values(tat=db_now_plus(arrival))
        )
    return wait


def hold_back(
    conn: Connection, dialect: str, handler: str, spends: Sequence[Spend], seconds: float
) -> None:
    """Push a handler's limits back so that no call may start for ``seconds`` (a key's
    ``Retry-After``): each limit's theoretical arrival time becomes at least ``seconds`` plus
    its tolerance from now. Locked as :func:`reserve` locks them."""
    ahead = _locked(conn, dialect, handler, spends)
    for spend in spends:
        until = min(seconds + spend.tolerance, MAX_WAIT_SECONDS)
        if ahead[spend.key] < until:
            conn.execute(
                update(_limits)
                .where(and_(_limits.c.handler == handler, _limits.c.key == spend.key))
                .values(tat=db_now_plus(until))
            )


def _locked(
    conn: Connection, dialect: str, handler: str, spends: Sequence[Spend]
) -> dict[str, float]:
    """Lock the limits' rows, made first where missing: the seconds from now to each limit's
    theoretical arrival time (negative: past)."""
    rows = [{"handler": handler, "key": spend.key} for spend in spends]
    keys = sorted({spend.key for spend in spends})
    locked: Sequence[Any] = ()
    # Twice at most: a row :func:`delete_idle_limits` removed between the insert and the lock
    # is inserted again (a removed row held no state: its arrival time had passed).
    for _ in range(2):
        dialects.statements(dialect).insert_ignoring_duplicates(conn, _limits, rows)
        locked = conn.execute(
            select(_limits.c.key, age_seconds(_limits.c.tat))
            .where(_limits.c.handler == handler, _limits.c.key.in_(keys))
            .order_by(_limits.c.key)
            .with_for_update()
        ).all()
        if len(locked) == len(keys):
            break
    return {key: 0.0 if age is None else -float(age) for key, age in locked}


def delete_idle_limits(conn: Connection, idle_seconds: float) -> int:
    """Forget the limits whose theoretical arrival time passed more than ``idle_seconds``
    ago (a tenant gone quiet): such a row holds no state, a reservation makes it again.
    Returns how many were deleted."""
    return conn.execute(delete(_limits).where(_limits.c.tat < db_now_plus(-idle_seconds))).rowcount
