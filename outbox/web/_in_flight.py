"""A wait for calls in flight (:class:`outbox._core.in_flight.InFlight`) that gives up without
stopping them: how the console of several databases reads each of them without letting one
that hangs hold a page."""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import anyio

POLL_SECONDS = 0.02
"""How often a wait looks whether the calls it waits for are done."""


async def wait(calls: Iterable[Future[Any]], seconds: float) -> None:
    """Wait until every one of ``calls`` is done, or ``seconds`` have passed; those not done
    go on without anyone waiting.

    It looks every :data:`POLL_SECONDS` rather than be woken: a wake-up from another thread
    is tied to one event loop library, and the console runs under any that Starlette does.
    """
    pending = [call for call in calls if not call.done()]
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        await anyio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        pending = [call for call in pending if not call.done()]
