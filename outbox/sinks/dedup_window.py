"""The check of a downstream's de-duplication window against a handler's retry schedule.

A broker that drops a message whose id it stored within a window (JetStream's
``duplicate_window``) stores no duplicate only when every re-send of an event comes within
that window: :func:`resend_horizon` is the longest time between two sends of one event, and
:func:`check_dedup_window` refuses, in one line, a handler whose re-sends would outlast it.
"""

from __future__ import annotations

from typing import Any

from outbox.app import Handler, Outbox
from outbox.exceptions import ConfigurationError


def resend_horizon(app: Outbox, handler: Handler[Any]) -> float:
    """The longest time, in seconds, between two sends of one event by ``handler``.

    A message sent whose acknowledgement was lost (a worker killed, a connection cut) is sent
    again by a later attempt: after the longest wait between two attempts (the last backoff,
    jitter included, or the circuit breaker's longest pause when longer), and after the lease
    of the attempt that was cut off, and the handler's ``timeout`` it may have run for. A
    broker that drops a re-sent message within a window catches every re-send when the window
    is at least this long.
    """
    policy = handler.retry
    backoff = 0.0
    if policy.max_attempts > 1:
        backoff = policy.base(policy.max_attempts - 1) * (1 + policy.jitter)
    if handler.circuit_breaker is not None:
        backoff = max(backoff, handler.circuit_breaker.max_probe_after)
    return backoff + app.settings.lease_seconds + (handler.timeout or 0.0)


def check_dedup_window(
    app: Outbox, handler: Handler[Any], window: float, where: str, lower: str
) -> None:
    """Refuse, in one line, a handler whose events may be re-sent after ``window`` seconds,
    the time ``where`` drops a re-sent message within; ``lower`` says how to lower the
    horizon."""
    horizon = resend_horizon(app, handler)
    if horizon > window:
        raise ConfigurationError(
            f"handler {handler.name!r}: {where} drops a re-sent message within {window:g} s, but "
            f"an event may be re-sent up to {horizon:.0f} s after it was first sent (the "
            f"longest retry wait, the lease and the timeout): raise the window to at least "
            f"{horizon:.0f} s, or {lower}"
        )
