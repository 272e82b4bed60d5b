"""Urgency bands: a priority and a promise of timely execution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from outbox.exceptions import ConfigurationError

DEFAULT_ALERT_STALENESS = 1.0
DEFAULT_ALERT_ATTEMPTS = 8
INTERACTIVE_ALERT_ATTEMPTS = 2


@dataclass(frozen=True, slots=True)
class Urgency:
    """An urgency band.

    ``priority``: lower runs first; work is taken by priority, then by due time.
    ``promise``: seconds within which work of this band is promised to start; the staleness of a
    handler is the age of its oldest unhandled event divided by this promise.
    ``alert_staleness``: staleness above which the band's promise counts as broken (1.0: the
    oldest event is older than the promise). ``alert_attempts``: failed attempts of one group
    at which an alert is raised; interactive bands alarm early (2), eventual ones late (8).

    The built-in bands are class attributes (``Urgency.REALTIME`` ... ``Urgency.WEEK``);
    applications may define their own, e.g. ``Urgency("NIGHTLY", priority=35, promise=43200.0)``.
    """

    name: str
    priority: int
    promise: float
    alert_staleness: float = DEFAULT_ALERT_STALENESS
    alert_attempts: int = DEFAULT_ALERT_ATTEMPTS

    REALTIME: ClassVar[Urgency]
    MINUTES: ClassVar[Urgency]
    HOUR: ClassVar[Urgency]
    DAY: ClassVar[Urgency]
    WEEK: ClassVar[Urgency]

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("Urgency.name must not be empty")
        if not 0 <= self.priority <= 32767:
            raise ConfigurationError(
                f"Urgency.priority must be between 0 and 32767, got {self.priority}"
            )
        if self.promise <= 0:
            raise ConfigurationError(f"Urgency.promise must be > 0 seconds, got {self.promise}")
        if self.alert_staleness <= 0:
            raise ConfigurationError(
                f"Urgency.alert_staleness must be > 0, got {self.alert_staleness}"
            )
        if self.alert_attempts < 1:
            raise ConfigurationError(
                f"Urgency.alert_attempts must be >= 1, got {self.alert_attempts}"
            )

    @classmethod
    def builtins(cls) -> tuple[Urgency, ...]:
        """The built-in bands, most urgent first."""
        return (cls.REALTIME, cls.MINUTES, cls.HOUR, cls.DAY, cls.WEEK)


Urgency.REALTIME = Urgency(
    "REALTIME", priority=0, promise=60.0, alert_attempts=INTERACTIVE_ALERT_ATTEMPTS
)
Urgency.MINUTES = Urgency(
    "MINUTES", priority=10, promise=300.0, alert_attempts=INTERACTIVE_ALERT_ATTEMPTS
)
Urgency.HOUR = Urgency("HOUR", priority=20, promise=3600.0)
Urgency.DAY = Urgency("DAY", priority=30, promise=86400.0)
Urgency.WEEK = Urgency("WEEK", priority=40, promise=604800.0)
