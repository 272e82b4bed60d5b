"""The check of a downstream's de-duplication window against a handler's retry schedule.

A broker that drops a message whose id it stored within a window (JetStream's
``duplicate_window``) stores no duplicate only when every re-send of an event comes within
that window: :func:`resend_horizon` is the longest time between two sends of one event, and
:func:`check_dedup_window` refuses, in one line, a handler whose re-sends would outlast it.
"""

from __future__ import annotations

from typing import Any

from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler


def resend_horizon(app: Outbox, handler: Handler[Any]) -> float:
    """The longest time, in seconds, between two sends of one event by ``handler``
    (:meth:`outbox.Outbox.resend_horizon`)."""
    return app.resend_horizon(handler)


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
            f"an event may be re-sent up to {horizon:.0f} s after it was first sent (every "
            f"retry wait, and the lease and timeout of each attempt before the last): raise "
            f"the window to at least {horizon:.0f} s, or {lower}"
        )
