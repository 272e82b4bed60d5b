"""RetryPolicy: how many attempts a group gets, and how long to wait between them."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from outbox.exceptions import ConfigurationError

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_EXPONENT = 4.0
DEFAULT_SCALE_SECONDS = 1.0
DEFAULT_BASE_DELAY_SECONDS = 5.0
DEFAULT_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff for a handler's groups.

    After failed attempt ``n`` the group waits::

        delay(n) = scale * n ** exponent + base_delay     (seconds)

    then a random ``±jitter`` fraction of it, so that groups failing together do not retry
    together. The defaults give 6 s, 21 s, 86 s, 261 s, ...: the seven waits between eight
    attempts add up to about 1.3 hours. ``max_delay`` caps a single wait. A value object: the
    current time is never read here; the database adds the delay to its own clock.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    exponent: float = DEFAULT_EXPONENT
    scale: float = DEFAULT_SCALE_SECONDS
    base_delay: float = DEFAULT_BASE_DELAY_SECONDS
    jitter: float = DEFAULT_JITTER
    max_delay: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}"
            )
        for field in ("exponent", "scale", "base_delay"):
            if getattr(self, field) < 0:
                raise ConfigurationError(f"RetryPolicy.{field} must be >= 0")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"RetryPolicy.jitter must be in [0, 1), got {self.jitter}")
        if self.max_delay is not None and self.max_delay < 0:
            raise ConfigurationError("RetryPolicy.max_delay must be >= 0 seconds")

    def base(self, attempt: int) -> float:
        """The wait in seconds after failed attempt ``attempt`` (1-based), before jitter."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        delay = float(self.scale * attempt**self.exponent + self.base_delay)
        return delay if self.max_delay is None else min(delay, self.max_delay)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait in seconds after failed attempt ``attempt``, jittered by ``rand()``."""
        base = self.base(attempt)
        return max(0.0, base * (1 + self.jitter * (2 * rand() - 1)))

    def exhausted(self, attempt: int) -> bool:
        """True when attempt ``attempt`` was the last one allowed."""
        return attempt >= self.max_attempts
