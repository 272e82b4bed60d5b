"""RateLimit: how fast a handler may call its downstream, across the whole fleet."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from outbox._core.checks import MAX_WAIT_SECONDS, is_number, is_whole
from outbox.exceptions import ConfigurationError

MARGIN_SECONDS = 0.03
"""How much longer than its period each window is kept, in seconds. A call's start is reserved
on the database's clock; the worker calls the handler no earlier than that, but may be later by
the reservation's commit, its wake-up and the interpreter's scheduling. A later call may then
come that much closer to an earlier one, so every window is counted over its period plus this
margin: calls at most this late still never share a period with more than the limit. A worker
that finds itself later than this before calling reserves again."""

MIN_PERIOD_SECONDS = 0.01
"""The shortest period a limit may have: finer than that, the databases' clocks cannot tell."""


class Unit(StrEnum):
    """What a limit counts: handler calls (one per group), or the events handed over."""

    CALLS = "calls"
    EVENTS = "events"


@dataclass(frozen=True, slots=True)
class Window:
    """One rule of a :class:`RateLimit`: at most ``capacity`` units start within any
    ``period`` seconds. ``exact``: the limit's own promise, counted with
    :data:`MARGIN_SECONDS`; a burst's spacing is not, and a call larger than its capacity waits
    for it to be empty."""

    unit: Unit
    capacity: int
    period: float
    exact: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """A handler's rate limit, shared by every worker of every process and host: the database
    keeps its state. ``@app.handler(..., rate_limit=RateLimit(calls=100, per=60))``, or several
    at once: ``rate_limit=[RateLimit(calls=10), RateLimit(calls=2, key="account_id")]``, all
    kept together, the strictest deciding.

    ``calls``: handler calls (one per group) that may start within any ``per`` seconds.
    ``events``: events handed to the handler within any ``per`` seconds, a group counting all
    its events when it is handed over. Either or both. ``per``: the period in seconds (default
    1). ``key``: a column of the buffer (its attribute on the model, or its name in the table):
    the limit applies to each of its values on its own (a limit per account); default: the
    handler's ``rate_limit_key``, or the whole fleet without it.

    The windows are exact: counted at the handler's entry, no ``per`` seconds ever hold more
    than the limit, across processes and hosts (each window is kept :data:`MARGIN_SECONDS`
    longer than its period, for the jitter of a worker's start). A limit may be set to the
    downstream's own.

    ``calls_per_second`` and ``events_per_second`` say the same per second: whole calls, so
    ``calls_per_second=4.5`` allows 4 calls in any second; under one a second, one call per
    ``1 / calls_per_second`` seconds. ``burst``: at most that many calls back to back, the
    rest spaced out; by default calls are evenly spaced, ``per / calls`` apart (``burst=1``),
    since a downstream counts arrivals, and a window's calls sent all at once arrive with
    their own jitter, some in the downstream's next second. ``burst=calls`` lets a whole
    window's calls start at once. ``event_burst``: the same in events (by default, none: a
    window's events may start at once).

    A worker waits for its group's turn holding the group, up to a third of the lease; a group
    whose turn is further off goes back to wait in the job table, its attempt not counted.
    """

    calls: int | None = None
    events: int | None = None
    per: float = 1.0
    key: str | None = None
    calls_per_second: float | None = None
    events_per_second: float | None = None
    burst: int | None = None
    event_burst: int | None = None

    def __post_init__(self) -> None:
        if all(
            getattr(self, name) is None
            for name in ("calls", "events", "calls_per_second", "events_per_second")
        ):
            raise ConfigurationError(
                "RateLimit needs calls or events (per `per` seconds), or calls_per_second or "
                "events_per_second"
            )
        for name in ("calls", "events"):
            value = getattr(self, name)
            if value is not None and not (is_whole(value) and value >= 1):
                raise ConfigurationError(
                    f"RateLimit.{name} must be a whole number >= 1, got {value!r}"
                )
            if value is not None and getattr(self, f"{name}_per_second") is not None:
                raise ConfigurationError(
                    f"RateLimit.{name} and RateLimit.{name}_per_second say the same: give one"
                )
        if not (is_number(self.per) and MIN_PERIOD_SECONDS <= self.per <= MAX_WAIT_SECONDS):
            raise ConfigurationError(
                f"RateLimit.per must be a number of seconds, {MIN_PERIOD_SECONDS:g} to a year "
                f"({MAX_WAIT_SECONDS:.0f}), got {self.per!r}"
            )
        if self.per != 1 and self.calls is None and self.events is None:
            raise ConfigurationError(
                f"RateLimit.per applies to calls and events; calls_per_second and "
                f"events_per_second are per second already, got per={self.per!r}"
            )
        for name in ("calls_per_second", "events_per_second"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and value >= 1 / MAX_WAIT_SECONDS):
                raise ConfigurationError(
                    f"RateLimit.{name} must be a number, at least one a year "
                    f"({1 / MAX_WAIT_SECONDS:.3g}), got {value!r}"
                )
        for name, unit in (("burst", Unit.CALLS), ("event_burst", Unit.EVENTS)):
            value = getattr(self, name)
            if value is not None and not (is_whole(value) and value >= 1):
                raise ConfigurationError(
                    f"RateLimit.{name} must be a whole number >= 1 or None, got {value!r}"
                )
            if value is not None and self._main(unit) is None:
                raise ConfigurationError(f"RateLimit.{name} needs a limit of {unit} to space out")
        if self.key is not None and not (isinstance(self.key, str) and self.key):
            raise ConfigurationError(
                f"RateLimit.key must be a column's name (a non-empty string) or None, "
                f"got {self.key!r}"
            )

    def _main(self, unit: Unit) -> Window | None:
        """The limit's window of ``unit``, from whichever way it was given."""
        whole = self.calls if unit is Unit.CALLS else self.events
        if whole is not None:
            return Window(unit, whole, float(self.per))
        rate = self.calls_per_second if unit is Unit.CALLS else self.events_per_second
        if rate is None:
            return None
        if rate >= 1:
            return Window(unit, math.floor(rate), 1.0)
        return Window(unit, 1, 1 / rate)

    def windows(self) -> tuple[Window, ...]:
        """The rules this limit keeps: its calls and events windows, and a burst's spacing."""
        found = []
        for unit, given in ((Unit.CALLS, self.burst), (Unit.EVENTS, self.event_burst)):
            main = self._main(unit)
            if main is None:
                continue
            found.append(main)
            # Calls evenly spaced unless told; events in a call come together, so their window
            # alone keeps them (a spacing of one event would not space calls of many).
            burst = (1 if unit is Unit.CALLS else None) if given is None else given
            if burst is not None and burst < main.capacity:
                period = burst * main.period / main.capacity
                found.append(Window(unit, burst, period, exact=False))
        return tuple(found)

    def describe(self) -> str:
        """The limit in words (``10 calls/s, burst 5; 100 events/min per account_id``)."""
        parts = []
        for unit, burst in ((Unit.CALLS, self.burst), (Unit.EVENTS, self.event_burst)):
            main = self._main(unit)
            if main is None:
                continue
            spaced = f", burst {burst}" if burst is not None else ""
            noun = str(unit) if main.capacity != 1 else str(unit)[:-1]
            parts.append(f"{main.capacity} {noun}{_per(main.period)}{spaced}")
        per_key = "" if self.key is None else f" per {self.key}"
        return "; ".join(parts) + per_key


def _per(period: float) -> str:
    """``/s``, ``/min``, ``/h`` or `` per 90 s``."""
    named = {1.0: "/s", 60.0: "/min", 3600.0: "/h", 86_400.0: "/day"}
    return named.get(period, f" per {period:g} s")
