"""RetryPolicy: how many attempts a group gets, and how long to wait between them; RetryAfter:
a handler's word that the downstream wants it back later."""

from __future__ import annotations

import datetime as dt
import email.utils
import random
from collections.abc import Callable
from dataclasses import dataclass

from outbox._core import log as _log
from outbox._core.checks import MAX_WAIT_SECONDS, is_number, is_whole
from outbox.exceptions import ConfigurationError, OutboxError

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_EXPONENT = 4.0
DEFAULT_SCALE_SECONDS = 1.0
DEFAULT_BASE_DELAY_SECONDS = 5.0
DEFAULT_JITTER = 0.1
DEFAULT_MAX_DEFERRALS = 100

log = _log.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff for a handler's groups.

    After failed attempt ``n`` the group waits::

        delay(n) = scale * n ** exponent + base_delay     (seconds)

    then a random ``±jitter`` fraction of it, so that groups failing together do not retry
    together. The defaults give 6 s, 21 s, 86 s, 261 s, ...: the seven waits between eight
    attempts add up to about 1.3 hours. ``max_delay`` caps a single wait. A value object: the
    current time is never read here; the database adds the delay to its own clock.

    ``max_deferrals``: how many times a group may be put off for the downstream's Retry-After
    (:class:`outbox.RetryAfter`, ``batch.retry(..., after=)``) without using up an attempt;
    past them, each counts as a failed attempt, so that a group cannot be deferred forever.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    exponent: float = DEFAULT_EXPONENT
    scale: float = DEFAULT_SCALE_SECONDS
    base_delay: float = DEFAULT_BASE_DELAY_SECONDS
    jitter: float = DEFAULT_JITTER
    max_delay: float | None = None
    max_deferrals: int = DEFAULT_MAX_DEFERRALS

    def __post_init__(self) -> None:
        if not (is_whole(self.max_attempts) and self.max_attempts >= 1):
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be a whole number >= 1, got {self.max_attempts!r}"
            )
        for field in ("exponent", "scale", "base_delay"):
            value = getattr(self, field)
            if not (is_number(value) and value >= 0):
                raise ConfigurationError(
                    f"RetryPolicy.{field} must be a number >= 0, got {value!r}"
                )
        if not (is_number(self.jitter) and 0 <= self.jitter < 1):
            raise ConfigurationError(f"RetryPolicy.jitter must be in [0, 1), got {self.jitter!r}")
        if not (is_whole(self.max_deferrals) and self.max_deferrals >= 0):
            raise ConfigurationError(
                f"RetryPolicy.max_deferrals must be a whole number >= 0, got {self.max_deferrals!r}"
            )
        if self.max_delay is not None and not (is_number(self.max_delay) and self.max_delay >= 0):
            raise ConfigurationError(
                f"RetryPolicy.max_delay must be >= 0 seconds or None, got {self.max_delay!r}"
            )

    def base(self, attempt: int) -> float:
        """The wait in seconds after failed attempt ``attempt`` (1-based), before jitter."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        try:
            delay = float(self.scale) * float(attempt) ** float(self.exponent) + self.base_delay
        except OverflowError:  # a curve steep enough to leave the floats: far past the cap
            delay = MAX_WAIT_SECONDS
        return _capped(delay if self.max_delay is None else min(delay, self.max_delay))

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait in seconds after failed attempt ``attempt``, jittered by ``rand()``."""
        base = self.base(attempt)
        return _capped(max(0.0, base * (1 + self.jitter * (2 * rand() - 1))))

    def exhausted(self, attempt: int) -> bool:
        """True when attempt ``attempt`` was the last one allowed."""
        return attempt >= self.max_attempts


def _capped(seconds: float) -> float:
    # A year at most, however steep the curve: past the year 9999 no database stores the time.
    return min(seconds, MAX_WAIT_SECONDS)


When = float | int | str | dt.timedelta | dt.datetime

MIN_RETRY_AFTER_SECONDS = 1.0
"""The shortest wait a deferral gets by default (``Settings.min_retry_after``): a
``Retry-After`` of 0, a negative one or an HTTP date already past waits this long (jittered as
every deferral is), so that a downstream answering "now" to every call is not called a hundred
times a second."""
DEFAULT_RETRY_AFTER_SECONDS = 30.0
"""The wait of a deferral whose ``Retry-After`` text cannot be read (neither seconds nor an HTTP
date, or more than a year away): a downstream's broken header, logged as a warning."""


class RetryAfter(OutboxError):  # noqa: N818 - named for the HTTP header it carries
    """Raised by a handler: the downstream refused the whole group for now (HTTP 429 or 503)
    and said when to come back.

    ``after``: seconds, a ``timedelta``, an aware ``datetime``, or the ``Retry-After`` header's
    own text (seconds, or an HTTP date). The group is attempted again no sooner than that, and
    the attempt is not counted: it becomes a *deferral*, of which a group gets
    ``RetryPolicy.max_deferrals`` before further ones count as failed attempts. The handler is
    paused until then across the fleet, since every other group would get the same answer;
    with per-key limits (``rate_limit_key``), only the group's keys wait.

    Waits have a floor and a ceiling: an ``after`` of 0, negative or in the past waits
    ``Settings.min_retry_after`` (1 s by default); header text that cannot be read waits
    ``DEFAULT_RETRY_AFTER_SECONDS`` (30 s) and logs a warning; a number, ``timedelta`` or
    ``datetime`` more than a year away, another type, a naive ``datetime`` or a ``reason``
    that is not a string are refused here (``ValueError``/``TypeError``), which fails the
    attempt with that error. ``expires_after`` still applies to the events of a deferred group.
    """

    def __init__(self, after: When, reason: str | None = None) -> None:
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"RetryAfter: reason must be a str or None, got {_kind(reason)}")
        self.seconds = wait_seconds(after, "RetryAfter: after")
        self.reason = reason
        super().__init__(f"retry after {self.seconds:g} s" + (f": {reason}" if reason else ""))


def wait_seconds(after: When, argument: str) -> float:
    """The seconds a downstream's ``after`` asks to wait (see :class:`RetryAfter`), 0 for
    "now" or a time past (the worker applies ``Settings.min_retry_after``); unreadable header
    text asks ``DEFAULT_RETRY_AFTER_SECONDS``. ``argument`` names ``after`` in the errors."""
    if isinstance(after, str):
        try:
            seconds = seconds_until(after)
        except ValueError:
            log.warning(
                _log.RETRY_AFTER_UNREADABLE,
                value=after[:80],
                seconds=DEFAULT_RETRY_AFTER_SECONDS,
            )
            return DEFAULT_RETRY_AFTER_SECONDS
    elif isinstance(after, bool) or not isinstance(after, int | float | dt.timedelta | dt.datetime):
        raise TypeError(
            f"{argument} must be seconds, a timedelta, an aware datetime or Retry-After text, "
            f"got {_kind(after)}"
        )
    else:
        try:
            seconds = seconds_until(after)
        except ValueError as error:
            raise ValueError(f"{argument}: {error}") from None
    return seconds


def seconds_until(when: When) -> float:
    """Seconds from now until ``when`` (see :class:`RetryAfter`), never negative."""
    if isinstance(when, str):
        text = when.strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            return seconds_until(number)
        try:
            moment = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            message = f"not a Retry-After value (seconds or an HTTP date): {when!r}"
            raise ValueError(message) from None
        # An HTTP date is in GMT; "-0000" (no zone said) parses without one.
        return seconds_until(moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC))
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            raise ValueError(f"a datetime given to outbox needs a time zone: {when!r}")
        seconds = (when - dt.datetime.now(dt.UTC)).total_seconds()
    elif isinstance(when, dt.timedelta):
        seconds = when.total_seconds()
    elif is_number(when):
        seconds = float(when)
    else:
        raise ValueError(f"not a number of seconds: {when!r}")
    if seconds > MAX_WAIT_SECONDS:
        raise ValueError(
            f"{when!r} is {seconds:.0f} s away, more than outbox waits for anything "
            f"({MAX_WAIT_SECONDS:.0f} s, 366 days)"
        )
    return max(seconds, 0.0)


def _kind(value: object) -> str:
    """A value's type, for an error message (its text may be long, or fail to print)."""
    return type(value).__qualname__
