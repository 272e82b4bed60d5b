"""Flow control: a handler says when the downstream wants it back (:class:`RetryAfter`), and
handlers are paused and resumed across the whole fleet (:func:`pause`, :func:`resume`), and the
claim jobs each handler needs are enqueued now (:func:`distribute`, what ``outbox distribute``
runs from cron).

A pause lives in the database (``outbox_handlers``): no worker anywhere leases a paused
handler's jobs, and a worker that already holds one gives it back unattempted. The handler's
events keep arriving and waiting; ``outbox status`` and ``outbox check`` keep reporting their
backlog and age, and say why they are late.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection

from outbox._db import queries, run_in_transaction
from outbox._engine import distributor
from outbox._engine.distributor import Distribution
from outbox._engine.limiter import row_name
from outbox._services import retention
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops import operators
from outbox.retry import RetryAfter, When, seconds_until
from outbox.schema import OperationAction, PauseCause

__all__ = [
    "IDLE_LIMIT_SECONDS",
    "Distribution",
    "LimitUse",
    "Pause",
    "PauseCause",
    "RetryAfter",
    "distribute",
    "forget_idle_limits",
    "limit_use",
    "pause",
    "paused",
    "resume",
    "seconds_until",
]

IDLE_LIMIT_SECONDS = 3600.0
"""A rate limit's row is forgotten once its last call's turn is this far past."""


@dataclass(frozen=True, slots=True)
class Pause:
    """A handler's pause, as the fleet sees it."""

    handler: str
    cause: PauseCause
    reason: str | None
    seconds_left: float | None
    """Until the pause ends by itself; None: until resumed."""


def pause(
    app: Outbox,
    handler: str,
    *,
    until: When | None = None,
    reason: str | None = None,
    actor: str | None = None,
) -> None:
    """Pause ``handler`` across the fleet: until ``until`` (seconds, a ``timedelta`` or an aware
    ``datetime``), or until :func:`resume` when None. Replaces any pause it has. Recorded as an
    operation by ``actor`` (default: ``user@host``; ``outbox history``)."""
    app.get_handler(handler)
    seconds = None if until is None else _operator_seconds(until)

    def work(conn: Connection) -> None:
        queries.pause_handler(
            conn, app.dialect, handler, seconds=seconds, cause=PauseCause.OPERATOR, reason=reason
        )
        selection = {"handlers": [handler], "seconds": seconds}
        operators.record_in(conn, OperationAction.PAUSE, actor, selection, detail=reason)

    run_in_transaction(app.engine, work)


def resume(app: Outbox, handler: str, *, actor: str | None = None) -> bool:
    """End ``handler``'s pause now (whoever paused it) and close its circuit breaker; False
    when it was not paused. Recorded as an operation by ``actor`` (default: ``user@host``)."""
    app.get_handler(handler)

    def work(conn: Connection) -> bool:
        was = queries.resume_handler(conn, handler)
        selection = {"handlers": [handler]}
        detail = None if was else "it was not paused"
        operators.record_in(conn, OperationAction.RESUME, actor, selection, detail=detail)
        return was

    return run_in_transaction(app.engine, work)


def paused(app: Outbox) -> dict[str, Pause]:
    """The handlers paused now, by name."""
    with app.engine.connect() as conn:
        states = queries.handler_states(conn)
    return {
        name: Pause(name, PauseCause(state.cause), state.reason, state.paused_for)
        for name, state in sorted(states.items())
        if state.paused and state.cause is not None
    }


@dataclass(frozen=True, slots=True)
class LimitUse:
    """How close a handler runs to one of its fleet-wide rate limits: what its window has
    spent now, of what it may."""

    limit: str
    """The limit in words (``10 calls/s``)."""
    unit: str
    """``calls`` or ``events``."""
    used: int
    capacity: int
    period: float
    """The window, in seconds."""


def limit_use(app: Outbox, handler: str) -> list[LimitUse]:
    """How much of each of ``handler``'s fleet-wide rate limits (calls and events windows)
    the last window spent, by the database clock: what the dashboard's handler page shows.
    Per-key limits (one window per tenant) are not summed here."""
    target = app.get_handler(handler)
    found = []
    with app.engine.connect() as conn:
        for limit in target.rate_limits:
            if limit.key is not None:
                continue
            for window in limit.windows():
                if not window.exact:
                    continue  # a burst's spacing: the main window says how close it runs
                used = queries.window_usage(
                    conn, handler, row_name(window, None, None), window.period
                )
                found.append(
                    LimitUse(
                        limit.describe(), str(window.unit), used, window.capacity, window.period
                    )
                )
    return found


def forget_idle_limits(app: Outbox, idle_seconds: float = IDLE_LIMIT_SECONDS) -> int:
    """Delete the rate-limit rows of keys (tenants, with ``rate_limit_key``) that have been
    quiet for ``idle_seconds``: they hold no state, and one row per key ever seen would grow
    without end. ``outbox prune`` runs it. Returns how many were deleted."""
    return run_in_transaction(
        app.engine, lambda conn: queries.delete_idle_limits(conn, idle_seconds)
    )


def _operator_seconds(until: When) -> float:
    try:
        seconds = seconds_until(until)
    except ValueError as error:
        raise ConfigurationError(f"pause until: {error}") from None
    # A Retry-After in the past means "now"; an operator's pause that ends before it starts is
    # a mistake, said where it is made rather than a pause that does nothing.
    if isinstance(until, dt.timedelta):
        ahead = until.total_seconds() > 0
    elif isinstance(until, int | float):
        ahead = until > 0
    else:
        ahead = seconds > 0
    if not ahead:
        raise ConfigurationError(f"pause until: expected a time ahead of now, got {until!r}")
    return seconds


def distribute(
    app: Outbox, handlers: tuple[str, ...] | list[str] = (), *, patience: float = 0.0
) -> list[Distribution]:
    """Enqueue the claim jobs every handler (or the named ones) needs; what each one did.

    How many a handler needs, and why overlapping runs are safe, is the distributor's
    (``outbox._engine.distributor``). ``patience``: seconds to keep retrying through a database
    outage before giving up. A buffer table that does not exist raises
    BufferTableMissingError.

    Then a pass of the archive's retention (``Settings.archive_retention_days``; the
    archive's days ahead are made either way), at most every ten minutes in a process: from
    cron, where no ``outbox work`` may run, this is what keeps them.
    """
    done = distributor.run_once(app, handlers, patience=patience)
    retention.pass_if_due(app)
    return done
