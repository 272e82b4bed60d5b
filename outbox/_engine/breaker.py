"""A handler's circuit breaker, counted in the database across the fleet.

Each group that failed because of the downstream (an attempt that raised, or ran out of
attempts, with the cause ``downstream``: see ``outbox._engine.causes``) adds one to the
handler's ``failures``; the ``failures``-th in a row opens the breaker: the handler is paused (cause
``breaker``) for ``CircuitBreaker.open_for(trips)``. Once that pause is over the breaker
probes: workers run the handler one group at a time, fleet-wide (a cap of one, enforced as
``concurrency`` caps are). A group that succeeds closes it (``failures`` and ``trips`` back to
0); a probe that fails opens it again, for twice as long. Deferrals, failures the data
caused, lost leases and refused writes are not failures of the downstream and count for
nothing.

A success writes only where there is a count to reset. The worker's view of the breakers
(``FlowState``, read every second) says where one may be: a handler whose count was read as
none, and for which this worker counted no failure since, has none to reset, and its
successes cost the database nothing. A failure another process counted since that read is
seen at the next one: a success in that second does not break the run it belongs to.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox._engine.flow_state import FlowState
from outbox.app import Outbox
from outbox.breaker import CircuitBreaker
from outbox.handler import Handler
from outbox.results import DEAD, RETRYING, SUCCEEDED, BatchResult, FailureCause
from outbox.schema import PauseCause

log = _log.get_logger(__name__)


def record(
    app: Outbox,
    handler: Handler[Any],
    breaker: CircuitBreaker,
    result: BatchResult,
    flow: FlowState,
) -> bool:
    """Count one batch result; True when the breaker opened or closed. ``flow``: what the
    worker knows of its handlers' breakers (a success with no count to reset writes nothing)."""
    if result.outcome == SUCCEEDED:
        if not flow.counting(handler.name):
            return False
        closed = run_in_transaction(
            app.engine, lambda conn: queries.reset_breaker(conn, handler.name)
        )
        if closed:
            log.info(_log.BREAKER_CLOSED, handler=handler.name, group_id=str(result.group_id))
        return closed
    if result.outcome not in (RETRYING, DEAD) or result.cause != FailureCause.DOWNSTREAM:
        # Only the downstream's failures: a poison event (DataError, or a group bisection is
        # isolating it in) says nothing about the downstream's health.
        return False
    # Noted before it is written (a success of another thread meanwhile must reset it) and
    # again once committed (a refresh whose read began before the commit did not see it).
    flow.note_failure(handler.name)
    opened = run_in_transaction(
        app.engine, lambda conn: _count_failure(conn, app, handler, breaker, result.error)
    )
    flow.note_failure(handler.name)
    if opened is None:
        return False
    seconds, trips, why = opened
    log.warning(
        _log.BREAKER_OPENED, handler=handler.name, seconds=round(seconds, 3), trips=trips, why=why
    )
    return True


def _count_failure(
    conn: Connection,
    app: Outbox,
    handler: Handler[Any],
    breaker: CircuitBreaker,
    error: str | None,
) -> tuple[float, int, str] | None:
    """Add a failed group under the handler row's lock; (seconds, trips, why) when the breaker
    opens."""
    state = queries.lock_handler_state(conn, app.dialect, handler.name)
    failures = state.failures + 1
    probing = state.trips > 0
    if state.paused or (not probing and failures < breaker.failures):
        # Paused already: a group that was in flight when the breaker opened (or an operator
        # paused the handler); it counts, and changes nothing else.
        queries.set_breaker_counts(conn, handler.name, failures=failures, trips=state.trips)
        return None
    trips = state.trips + 1
    seconds = breaker.open_for(trips)
    why = "a probe failed" if probing else f"{failures} groups failed in a row"
    last = (error or "").splitlines()[0][:300] if error else ""
    queries.set_breaker_counts(conn, handler.name, failures=0, trips=trips)
    queries.pause_handler(
        conn,
        app.dialect,
        handler.name,
        seconds=seconds,
        cause=PauseCause.BREAKER,
        reason=f"circuit breaker open: {why}" + (f"; last error: {last}" if last else ""),
        only_to_extend=True,
    )
    return seconds, trips, why
