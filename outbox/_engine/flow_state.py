"""What one worker knows of its handlers' pauses and circuit breakers.

The database decides: no worker leases a paused handler's jobs (``queries.not_paused``). A
worker also holds jobs it leased before a pause began, and claims groups that come back leased
to it; before handing such a group to its handler it asks here, and gives the job back
unattempted while the handler is paused. What it knows is read again at most every
``refresh_every`` seconds, and a pause it writes itself (a Retry-After) counts at once.

It also knows which handlers' circuit breakers hold a count (failures in a row, or trips): a
group that succeeds resets that count in the database only where there is one to reset, and
none is there unless a failure was counted since it was last read as none.
"""

from __future__ import annotations

import threading
import time

from outbox._db import queries
from outbox.app import Outbox


class FlowState:
    """Handler name -> when its pause ends (``time.monotonic()``; ``inf``: until resumed), and
    the handlers whose circuit breaker probes (one group at a time, fleet-wide)."""

    def __init__(self, app: Outbox, *, refresh_every: float) -> None:
        self._app = app
        self._refresh_every = refresh_every
        self._ends: dict[str, float] = {}
        self._probing: frozenset[str] = frozenset()
        self._counting: frozenset[str] = frozenset()
        # Failures this worker counted since the last refresh began: the read may have missed
        # them, and they count until a read that began after them.
        self._counted: set[str] = set()
        self._lock = threading.Lock()
        self._next_refresh = 0.0
        self._read_at = -float("inf")

    def refresh_if_due(self) -> None:
        """Read the pauses again when ``refresh_every`` has passed since the last time."""
        if time.monotonic() >= self._next_refresh:
            self.refresh()

    def refresh(self) -> None:
        began = time.monotonic()
        with self._lock:
            self._counted = set()
        with self._app.engine.connect() as conn:
            states = queries.handler_states(conn)
        now = time.monotonic()
        ends = {
            name: now + (float("inf") if state.paused_for is None else state.paused_for)
            for name, state in states.items()
            if state.paused
        }
        probing = frozenset(name for name, state in states.items() if state.trips > 0)
        counting = {name for name, state in states.items() if state.failures or state.trips}
        with self._lock:
            self._ends, self._probing = ends, probing
            self._counting = frozenset(counting | self._counted)
            self._next_refresh = now + self._refresh_every
            self._read_at = began

    def note_failure(self, handler: str) -> None:
        """This worker counted a failure of ``handler``'s breaker: it holds a count now."""
        with self._lock:
            self._counted.add(handler)
            self._counting |= {handler}

    def counting(self, handler: str) -> bool:
        """Whether ``handler``'s circuit breaker may hold a count (failures in a row, or trips)
        that a success must reset: it did when last read, or this worker counted a failure
        since; always, when that read is older than twice ``refresh_every`` (not kept fresh)."""
        with self._lock:
            stale = time.monotonic() - self._read_at > 2 * self._refresh_every
            return stale or handler in self._counting

    def note(self, handler: str, seconds: float) -> None:
        """A pause this worker wrote: it counts here at once, not at the next refresh."""
        end = time.monotonic() + seconds
        with self._lock:
            self._ends[handler] = max(self._ends.get(handler, 0.0), end)

    def probing(self, handler: str) -> bool:
        """Whether ``handler``'s circuit breaker has opened and not closed again: once its pause
        is over, it runs one group at a time until one succeeds."""
        return handler in self._probing

    def paused(self, handler: str) -> bool:
        """Whether ``handler`` is paused, as far as this worker knows."""
        with self._lock:
            end = self._ends.get(handler)
        return end is not None and time.monotonic() < end
