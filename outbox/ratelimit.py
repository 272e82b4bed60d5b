"""RateLimit: how fast a handler may call its downstream, across the whole fleet."""

from __future__ import annotations

from dataclasses import dataclass

from outbox._checks import MAX_WAIT_SECONDS, is_number, is_whole
from outbox.exceptions import ConfigurationError


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A handler's rate limit, shared by every worker of every process and host: the database
    keeps its state (``@app.handler(..., rate_limit=RateLimit(calls_per_second=10))``).

    ``calls_per_second``: handler calls (one per group) per second. ``events_per_second``:
    events handed to the handler per second, a group charged for all its events when it is
    handed over. Either or both. ``burst``: calls that may go back to back after a quiet
    spell (default 1: calls evenly spaced, ``1 / calls_per_second`` apart); ``event_burst``:
    the same in events (default 1: a group waits until the events before it are paid for).

    A worker waits for its group's turn holding the group, up to a third of the lease; a group
    whose turn is further off goes back to wait in the job table, its attempt not counted. Set
    the limit a little under the downstream's own: the calls leave the workers at the pace
    the limit gives, and reach the downstream with the network's jitter.
    """

    calls_per_second: float | None = None
    events_per_second: float | None = None
    burst: int = 1
    event_burst: int = 1

    def __post_init__(self) -> None:
        if self.calls_per_second is None and self.events_per_second is None:
            raise ConfigurationError("RateLimit needs calls_per_second, events_per_second, or both")
        for name in ("calls_per_second", "events_per_second"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and value >= 1 / MAX_WAIT_SECONDS):
                raise ConfigurationError(
                    f"RateLimit.{name} must be a number, at least one a year "
                    f"({1 / MAX_WAIT_SECONDS:.3g}), got {value!r}"
                )
        for name in ("burst", "event_burst"):
            value = getattr(self, name)
            if not (is_whole(value) and value >= 1):
                raise ConfigurationError(
                    f"RateLimit.{name} must be a whole number >= 1, got {value!r}"
                )

    def describe(self) -> str:
        """The limit in words (``10 calls/s, burst 5; 4000 events/s``)."""
        parts = []
        if self.calls_per_second is not None:
            burst = f", burst {self.burst}" if self.burst > 1 else ""
            parts.append(f"{self.calls_per_second:g} calls/s{burst}")
        if self.events_per_second is not None:
            burst = f", burst {self.event_burst}" if self.event_burst > 1 else ""
            parts.append(f"{self.events_per_second:g} events/s{burst}")
        return "; ".join(parts)
