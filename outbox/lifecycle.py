"""What a handler object may do besides handling batches: check its downstream when a worker
starts, state its delivery guarantee, and close its connections when the worker stops.

A handler is any callable that takes a batch. An object (the ready-made sinks of
:mod:`outbox.sinks` are such objects) may also have:

``outbox_start(app, handler)``
    Called once by each worker before it runs any group of ``handler`` (and by ``outbox
    status`` and ``outbox check``, then ``outbox_stop``, to learn whether a worker would
    start, and what the object checked: :func:`refusal`); it may be
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

import contextlib
import functools
from collections.abc import Awaitable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from outbox._core import log as _log
from outbox._engine import invoke as _invoke
from outbox.exceptions import ConfigurationError, DownstreamUnavailableError

if TYPE_CHECKING:
    from outbox.app import Outbox
    from outbox.handler import Handler

# How many handlers' start checks `outbox status` and `outbox check` run at once: each may
# wait for its downstream's connect timeout.
CHECKS_AT_ONCE = 8


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


def start(app: Outbox, handler: Handler[Any]) -> None:
    """Call ``handler``'s object's ``outbox_start``, if it has one, and wait for it: what a
    worker does for each handler before it runs any group, and what :func:`refusal` does."""
    func = handler.func
    if isinstance(func, Starts):
        _invoke.call_hook(handler, functools.partial(func.outbox_start, app, handler))


def stop(handler: Handler[Any]) -> None:
    """Call ``handler``'s object's ``outbox_stop``, if it has one, and wait for it."""
    func = handler.func
    if isinstance(func, Stops):
        _invoke.call_hook(handler, func.outbox_stop)


def start_all(
    app: Outbox, handlers: Iterable[Handler[Any]], log: _log.Logger, **log_fields: Any
) -> None:
    """:func:`start` each of ``handlers`` in turn, as a worker does before it runs any group:
    what one raises is raised here, once the handlers started before it are stopped again
    (:func:`stop_all`, which logs on ``log`` with ``log_fields``)."""
    started: list[Handler[Any]] = []
    try:
        for handler in handlers:
            start(app, handler)
            started.append(handler)
    except BaseException:
        stop_all(started, log, **log_fields)
        raise


def stop_all(handlers: Iterable[Handler[Any]], log: _log.Logger, **log_fields: Any) -> None:
    """:func:`stop` each of ``handlers`` in turn; what one raises is logged on ``log`` (the
    caller's, so that the line keeps its logger's name), with ``log_fields`` such as the
    worker's id, and the next is stopped all the same."""
    for handler in handlers:
        if isinstance(handler.func, Stops):
            try:
                stop(handler)
            except Exception as error:
                log.warning(
                    _log.HANDLER_STOP_FAILED,
                    **log_fields,
                    handler=handler.name,
                    error=f"{type(error).__name__}: {error}",
                )


def refusal(app: Outbox, handler: Handler[Any]) -> str | None:
    """Why a worker would refuse to start ``handler``, in one line naming it (a downstream it
    cannot reach, a configuration its object refuses, such as a de-duplication window
    shorter than the handler's re-send horizon); None when it would start. It runs the
    worker's own start check (:func:`start`), then :func:`stop`: it connects, as a worker
    does, and closes."""
    try:
        start(app, handler)
    except Exception as error:  # whatever it raises stops a worker
        message = " ".join(str(error).split())
        if not isinstance(error, ConfigurationError | DownstreamUnavailableError):
            message = f"{type(error).__name__}: {message}"
        named = f"handler {handler.name!r}"
        return message if message.startswith(named) else f"{named}: {message}"
    finally:
        with contextlib.suppress(Exception):  # a worker logs it; the check has its answer
            stop(handler)
    return None


def refusals(app: Outbox, handlers: Iterable[Handler[Any]]) -> dict[str, str | None]:
    """:func:`refusal` of each of ``handlers`` whose object has a start check, by handler
    name, run at once (a downstream that does not answer costs its connect timeout once)."""
    # One object registered as several handlers is started for one at a time: a stop must
    # not close what the start of another is using.
    by_object: dict[int, list[Handler[Any]]] = {}
    for handler in handlers:
        if isinstance(handler.func, Starts):
            by_object.setdefault(id(handler.func), []).append(handler)
    if not by_object:
        return {}

    def check(handlers_of_one: list[Handler[Any]]) -> list[tuple[str, str | None]]:
        return [(h.name, refusal(app, h)) for h in handlers_of_one]

    with ThreadPoolExecutor(min(CHECKS_AT_ONCE, len(by_object))) as pool:
        found = list(pool.map(check, by_object.values()))
    return {name: reason for pairs in found for name, reason in pairs}
