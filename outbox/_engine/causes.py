"""What caused a failed attempt: the downstream, or the events (see ``FailureCause``).

A circuit breaker must count only the downstream's failures: a poison event refused by a
healthy API says nothing about the API, and counting it paused every other event of the
handler while bisection was still isolating it.
"""

from __future__ import annotations

from typing import Any

from outbox._db import queries
from outbox.exceptions import DataError, DownstreamError
from outbox.handler import Handler
from outbox.results import FailureCause
from outbox.retry import RetryAfter

# Exceptions that are the downstream's whatever the group: the network, or a call that did not
# answer in time (HandlerTimeoutError is a TimeoutError). httpx's transport errors do not derive
# from the built-in ones; they are known by name, so that httpx need not be imported.
_DOWNSTREAM_TYPES: tuple[type[BaseException], ...] = (
    DownstreamError,
    ConnectionError,
    TimeoutError,
)
_DOWNSTREAM_NAMES = frozenset({("httpx", "TransportError")})


def failure_cause(error: BaseException, handler: Handler[Any], job: queries.JobRow) -> FailureCause:
    """The cause of ``error``, raised by ``handler`` for ``job``'s group.

    A handler says it with :class:`outbox.DataError` or :class:`outbox.DownstreamError`.
    Unmarked, a failure is the downstream's (it protects the downstream: a breaker that never
    opens lets an outage burn every group's attempts), except in a group that bisection is
    isolating a poison event in: with ``bisect=True``, a group that failed before and failed
    again is taken as data (its halves keep failing for the same event), unless the error is
    one of the network's or a timeout.
    """
    if isinstance(error, DataError):
        return FailureCause.DATA
    if isinstance(error, _DOWNSTREAM_TYPES) or _named_downstream(error):
        return FailureCause.DOWNSTREAM
    return FailureCause.DATA if _bisecting(handler, job) else FailureCause.DOWNSTREAM


def _named_downstream(error: BaseException) -> bool:
    return any(
        (cls.__module__.split(".")[0], cls.__qualname__) in _DOWNSTREAM_NAMES
        for cls in type(error).__mro__
    )


def _bisecting(handler: Handler[Any], job: queries.JobRow) -> bool:
    """Is this group a failed group being bisected (or one of its halves)? In a bisecting
    handler, every group whose attempt failed is halved: a later attempt of it follows a
    failure, unless the attempt before was interrupted (rescued) or deferred past its budget."""
    if not handler.bisect or job.attempts < 2:
        return False
    last = job.last_error or ""
    return not last.startswith((queries.RESCUED_ERROR, RetryAfter.__name__))
