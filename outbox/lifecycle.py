"""What a handler object may do besides handling batches: check its downstream when a worker
starts, state its delivery guarantee, and close its connections when the worker stops.

A handler is any callable that takes a batch. An object (the ready-made sinks of
:mod:`outbox.sinks` are such objects) may also have:

``outbox_start(app, handler)``
    Called once by each worker before it runs any group of ``handler``; it may be
    ``async def`` (it then runs on the event loop the worker runs async handlers on, where the
    object's clients must live). It connects, checks what the handler is configured with, and
    raises :class:`outbox.ConfigurationError` or :class:`outbox.DownstreamUnavailableError`
    with one line to stop the worker from starting rather than fail every group.
``outbox_stop()``
    Called once when the worker stops (sync or ``async def``); what it raises is logged.
``outbox_guarantee``
    A string, the handler's delivery guarantee in words (``outbox status`` shows it): what is
    at least once, and what the downstream de-duplicates by.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from outbox.app import Handler, Outbox


@runtime_checkable
class Starts(Protocol):
    """A handler object that checks its downstream when a worker starts."""

    def outbox_start(self, app: Outbox, handler: Handler[Any]) -> Awaitable[None] | None:
        """Connect and check; raise ConfigurationError or DownstreamUnavailableError."""


@runtime_checkable
class Stops(Protocol):
    """A handler object that closes what it opened when a worker stops."""

    def outbox_stop(self) -> Awaitable[None] | None:
        """Close connections; called once per worker stop."""


def guarantee(handler: Handler[Any]) -> str | None:
    """The delivery guarantee ``handler``'s object states, or None when it states none."""
    text = getattr(handler.func, "outbox_guarantee", None)
    return text if isinstance(text, str) else None
