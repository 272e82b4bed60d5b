"""Statements on ``outbox_handlers``: what the fleet agrees on about a handler (its pause)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, exists, or_, select, update

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now, db_now_plus
from outbox._db.types import HandlerState

_handlers = schema.handlers


def paused_now() -> ColumnElement[bool]:
    """A handler row's condition: paused now (a pause with no end, or one that has not ended)."""
    return and_(
        _handlers.c.paused_at.is_not(None),
        or_(_handlers.c.paused_until.is_(None), _handlers.c.paused_until > db_now()),
    )


def not_paused(handler: ColumnElement[Any]) -> ColumnElement[bool]:
    """The condition that the handler named by ``handler`` (a column) is not paused now: one
    primary-key probe of the small ``outbox_handlers`` (a plain read, never a lock, even in a
    locking pick)."""
    return ~exists(select(_handlers.c.name).where(_handlers.c.name == handler, paused_now()))


def _ensure_row(conn: Connection, dialect: str, name: str) -> None:
    dialects.statements(dialect).insert_ignoring_duplicates(conn, _handlers, [{"name": name}])


def pause_handler(
    conn: Connection,
    dialect: str,
    name: str,
    *,
    seconds: float | None,
    cause: str,
    reason: str | None,
    only_to_extend: bool = False,
) -> bool:
    """Pause a handler for ``seconds`` (None: until resumed). Returns whether the pause was
    written.

    ``only_to_extend`` (an automatic pause: a Retry-After, the circuit breaker): leave a pause
    that ends at the same time or later, or never, as it is; an operator's pause is never
    shortened by one.
    """
    _ensure_row(conn, dialect, name)
    until = None if seconds is None else db_now_plus(seconds)
    stmt = update(_handlers).where(_handlers.c.name == name)
    if only_to_extend:
        assert until is not None
        longer = or_(_handlers.c.paused_until.is_(None), _handlers.c.paused_until >= until)
        stmt = stmt.where(~and_(_handlers.c.paused_at.is_not(None), longer))
    values = {
        "paused_at": db_now(),
        "paused_until": until,
        "pause_cause": cause,
        "pause_reason": reason,
    }
    return conn.execute(stmt.values(values)).rowcount == 1


def resume_handler(conn: Connection, name: str) -> bool:
    """End a handler's pause now and close its circuit breaker; False when it was not paused."""
    was_paused = conn.execute(
        select(_handlers.c.name).where(_handlers.c.name == name, paused_now())
    ).first()
    conn.execute(
        update(_handlers)
        .where(_handlers.c.name == name)
        .values(
            paused_at=None,
            paused_until=None,
            pause_cause=None,
            pause_reason=None,
            failures=0,
            trips=0,
        )
    )
    return was_paused is not None


def handler_states(conn: Connection) -> dict[str, HandlerState]:
    """Every handler's row, by name: whether it is paused now, and for how long yet."""
    return {state.name: state for state in map(_state, conn.execute(select(*_state_columns())))}


def lock_handler_state(conn: Connection, dialect: str, name: str) -> HandlerState:
    """A handler's row, created if need be, locked until the transaction ends: a second
    session locking it waits (on SQLite the transaction holds the database's write lock)."""
    _ensure_row(conn, dialect, name)
    stmt = select(*_state_columns()).where(_handlers.c.name == name).with_for_update()
    return _state(conn.execute(stmt).one())


def set_breaker_counts(conn: Connection, name: str, *, failures: int, trips: int) -> None:
    """Write a handler's circuit-breaker counts (its row exists: :func:`lock_handler_state`)."""
    conn.execute(
        update(_handlers).where(_handlers.c.name == name).values(failures=failures, trips=trips)
    )


def reset_breaker(conn: Connection, name: str) -> bool:
    """A group of the handler succeeded: no failure in a row any more, and a probing breaker
    closes. Returns whether it was probing. Writes only when there is something to reset."""
    counts = conn.execute(
        select(_handlers.c.failures, _handlers.c.trips).where(_handlers.c.name == name)
    ).first()
    if counts is None or not (counts.failures or counts.trips):
        return False
    set_breaker_counts(conn, name, failures=0, trips=0)
    return bool(counts.trips)


def _state_columns() -> tuple[ColumnElement[Any], ...]:
    return (
        _handlers.c.name,
        paused_now().label("paused"),
        _handlers.c.paused_until.is_(None).label("endless"),
        (-age_seconds(_handlers.c.paused_until)).label("left"),
        _handlers.c.pause_cause,
        _handlers.c.pause_reason,
        _handlers.c.failures,
        _handlers.c.trips,
    )


def _state(row: Any) -> HandlerState:
    name, paused, endless, left, cause, reason, failures, trips = row
    paused = bool(paused)
    return HandlerState(
        name=name,
        paused=paused,
        paused_for=None if not paused or endless else max(float(left), 0.0),
        cause=cause if paused else None,
        reason=reason if paused else None,
        failures=int(failures),
        trips=int(trips),
    )
