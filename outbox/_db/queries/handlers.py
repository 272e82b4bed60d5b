"""Statements on ``outbox_handlers``: what the fleet agrees on about a handler (its pause, its
circuit breaker, the newest distribution tick taken for it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, exists, or_, select, update

from outbox import schema
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus
from outbox._db.types import HandlerState
from outbox.schema import db_now

_handlers = schema.handlers
_operations = schema.operations


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


def take_distribution_tick(conn: Connection, name: str, tick: int) -> bool | None:
    """Take the distribution tick ``tick`` for a handler: True for the one caller that moves
    ``distributed_tick`` forward to it, False for every other caller of the same tick (or of
    an older one); None when the handler has no row yet (:func:`ensure_handler_row`, in a
    transaction of its own, then take the tick again).

    One conditional UPDATE of the handler's row, no lock taken beforehand: on PostgreSQL and
    MariaDB a second UPDATE of the row waits for the first to commit, then reads the committed
    tick again (PostgreSQL re-checks its WHERE on the new row version; InnoDB's locking read
    sees the latest committed one) and matches nothing; SQLite's transaction holds the
    database's write lock from BEGIN. The row count tells the winner; only a loser reads the
    row's primary key to tell a tick taken from a row missing. The transaction should commit
    at once: the row stays locked until then.
    """
    stmt = (
        update(_handlers)
        .where(
            _handlers.c.name == name,
            or_(_handlers.c.distributed_tick.is_(None), _handlers.c.distributed_tick < tick),
        )
        .values(distributed_tick=tick)
    )
    if conn.execute(stmt).rowcount == 1:
        return True
    present = conn.execute(select(_handlers.c.name).where(_handlers.c.name == name)).first()
    return False if present is not None else None


def ensure_handler_row(conn: Connection, dialect: str, name: str) -> None:
    """Make a handler's row if it has none. In a transaction of its own before a tick is
    taken, not in the tick's: MariaDB's INSERT IGNORE of a row another session is inserting
    leaves a shared lock on it, which an UPDATE in the same transaction would have to raise
    to an exclusive one; two sessions doing so at once deadlock."""
    _ensure_row(conn, dialect, name)


def distributed_ticks(conn: Connection) -> dict[str, int | None]:
    """The newest distribution tick taken for each handler that has a row (None: none yet)."""
    rows = conn.execute(select(_handlers.c.name, _handlers.c.distributed_tick))
    return {name: None if tick is None else int(tick) for name, tick in rows}


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


def lock_pause(conn: Connection, name: str) -> bool:
    """Whether a handler is paused now, its row locked until the transaction ends (on SQLite
    the transaction's write lock does it), so that a resume waits until the transaction is
    done: what a write that needs the handler to stay paused throughout checks first. A
    handler without a row was never paused."""
    stmt = (
        select(paused_now().label("paused"))
        .select_from(_handlers)
        .where(_handlers.c.name == name)
        .with_for_update()
    )
    return bool(conn.execute(stmt).scalar_one_or_none())


def paused_since_operation(conn: Connection, name: str, operation_id: int) -> bool:
    """Whether a handler is paused now by a pause that began no later than the operation
    ``operation_id`` was recorded: it has not run since (a resume clears the pause, and a
    pause made later starts later)."""
    recorded = (
        select(_operations.c.done_at).where(_operations.c.id == operation_id).scalar_subquery()
    )
    stmt = select(_handlers.c.name).where(
        _handlers.c.name == name, paused_now(), _handlers.c.paused_at <= recorded
    )
    return conn.execute(stmt).first() is not None


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
