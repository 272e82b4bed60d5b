"""Checks of option values given to outbox: numbers that are numbers, whole numbers that are
whole, and waits short enough for every database to store their end."""

from __future__ import annotations

import math

MAX_WAIT_SECONDS = 366 * 86_400.0
"""The longest outbox waits for anything: a pause, a deferral, a backoff, a circuit breaker's
probe. Longer is a typo or a broken header (past the year 9999, no database stores the time)."""


def is_number(value: object) -> bool:
    """A finite int or float (not a bool, not a numeric string)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_whole(value: object) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)
