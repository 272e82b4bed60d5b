"""CircuitBreaker: when consecutive failed groups pause a handler, and how it probes back."""

from __future__ import annotations

from dataclasses import dataclass

from outbox._core.checks import MAX_WAIT_SECONDS, is_number, is_whole
from outbox.exceptions import ConfigurationError

DEFAULT_FAILURES = 5
DEFAULT_PROBE_AFTER_SECONDS = 30.0
DEFAULT_MAX_PROBE_AFTER_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class CircuitBreaker:
    """A handler's circuit breaker (``@app.handler(..., circuit_breaker=CircuitBreaker())``).

    After ``failures`` groups in a row failed their attempt (across the whole fleet; a
    deferral is not a failure), the breaker *opens*: the handler is paused for
    ``probe_after`` seconds. When the pause ends it *probes*: one group at a time, fleet-wide.
    A probe that succeeds *closes* the breaker and the handler runs as before; a probe that
    fails opens it again for twice as long as the last time, up to ``max_probe_after``.
    ``outbox resume`` closes it at once.
    """

    failures: int = DEFAULT_FAILURES
    probe_after: float = DEFAULT_PROBE_AFTER_SECONDS
    max_probe_after: float = DEFAULT_MAX_PROBE_AFTER_SECONDS

    def __post_init__(self) -> None:
        if not (is_whole(self.failures) and self.failures >= 1):
            raise ConfigurationError(
                f"CircuitBreaker.failures must be a whole number >= 1, got {self.failures!r}"
            )
        for name in ("probe_after", "max_probe_after"):
            value = getattr(self, name)
            if not (is_number(value) and 0 < value <= MAX_WAIT_SECONDS):
                raise ConfigurationError(
                    f"CircuitBreaker.{name} must be > 0 seconds and at most a year "
                    f"({MAX_WAIT_SECONDS:.0f}), got {value!r}"
                )
        if self.max_probe_after < self.probe_after:
            raise ConfigurationError(
                "CircuitBreaker.max_probe_after must be >= probe_after, "
                f"got {self.max_probe_after!r} < {self.probe_after!r}"
            )

    def open_for(self, trips: int) -> float:
        """Seconds the breaker stays open at its ``trips``-th opening in a row (1-based)."""
        if trips < 1:
            raise ValueError(f"trips must be >= 1, got {trips}")
        # Past 2**60 the doubling has long passed any max_probe_after.
        return min(self.probe_after * 2.0 ** min(trips - 1, 60), self.max_probe_after)
