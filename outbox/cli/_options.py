"""The option types of the ``outbox`` command: durations, bounded seconds, archive statuses.

click's FloatRange lets NaN through (NaN compares false with any bound) and knows no units;
these refuse NaN, infinity and values out of range, naming the option and what it takes.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from outbox import schema

# The longest value any seconds option of `outbox work` takes. No interval of a running worker
# needs to be longer; a larger number is a typo (milliseconds given as seconds). The lease also
# becomes PostgreSQL's idle_in_transaction_session_timeout, which stops at about 24.8 days.
MAX_INTERVAL_SECONDS = 86_400.0
# A lease shorter than this is gone before the worker can renew it (it renews every third of
# the lease, from a loop that wakes once a second at the latest); and under a millisecond the
# PostgreSQL timeout derived from it would round to 0, which means "no timeout".
MIN_LEASE_SECONDS = 1.0
# The oldest `prune --older-than` takes: a retention beyond a century is a typo, and far older
# cut-offs overflow PostgreSQL's date arithmetic.
MAX_PRUNE_AGE_SECONDS = 100 * 365 * 86_400.0

# The longest `check --dead-since` takes, for the same reason.
MAX_DEAD_SINCE_SECONDS = MAX_PRUNE_AGE_SECONDS
# Words `--dead-since` takes for "no dead-letter alert", besides 0.
_OFF = frozenset({"off", "none", "no"})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d``, ``2w`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h, 30d or 2w")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class Duration(click.types.FloatParamType):
    """A duration option (``90s``, ``15m``, ``12h``, ``30d``, ``2w``) -> float seconds, at
    most ``maximum``; click names the option in the error."""

    name = "duration"

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """Parse ``value``; a usage error naming the option if it is not a duration in range."""
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(str(value))
        except click.BadParameter as error:
            self.fail(error.message, param, ctx)
        if seconds > self.maximum:
            self.fail(f"{value!r} is longer than {self.maximum / 86_400:g} days", param, ctx)
        return seconds


class DurationOrOff(Duration):
    """A duration, or ``off`` (also ``0``) -> 0.0: the feature it sets is off."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """``off`` -> 0.0; otherwise as :class:`Duration`, with ``off`` named in the error."""
        if isinstance(value, float):
            return value
        if str(value).strip().lower() in _OFF:
            return 0.0
        try:
            parse_duration(str(value))
        except click.BadParameter as error:
            self.fail(f"{error.message}, or off", param, ctx)
        return super().convert(value, param, ctx)


# `--status` of `replay` and `prune`: the words outbox.schema.ArchiveStatus spells, which the
# docs, the logs and `outbox status` use, in any case (click's Choice of the enum itself would
# take the members' names, DEAD, and refuse dead).
ARCHIVE_STATUS = click.Choice([s.value for s in schema.ArchiveStatus], case_sensitive=False)


class Seconds(click.types.FloatParamType):
    """A float number of seconds from ``minimum`` (excluded if ``exclude_minimum``) to
    ``maximum``. NaN and infinity are refused: click's FloatRange lets NaN through, as NaN
    compares false with any bound."""

    name = "seconds"

    def __init__(self, minimum: float, maximum: float, *, exclude_minimum: bool = False) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.exclude_minimum = exclude_minimum

    @property
    def allowed(self) -> str:
        """The range in words, for help texts and errors."""
        if self.exclude_minimum:
            return f"more than {self.minimum:g} and at most {self.maximum:g} seconds"
        return f"{self.minimum:g} to {self.maximum:g} seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """Parse ``value``; a usage error naming the option and the range if it is outside."""
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; expected {self.allowed}", param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number; expected {self.allowed}", param, ctx)
        above = seconds > self.minimum if self.exclude_minimum else seconds >= self.minimum
        if not (above and seconds <= self.maximum):
            self.fail(f"{value!r} is out of range; expected {self.allowed}", param, ctx)
        return seconds


LEASE = Seconds(MIN_LEASE_SECONDS, MAX_INTERVAL_SECONDS)
# Settings and Worker take any interval above 0; the upper bound is the CLI's.
INTERVAL = Seconds(0.0, MAX_INTERVAL_SECONDS, exclude_minimum=True)
GRACE_PERIOD = Seconds(0.0, MAX_INTERVAL_SECONDS)
