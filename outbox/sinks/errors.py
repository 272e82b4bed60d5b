"""The errors a sink raises for what went wrong outside it: a downstream it cannot reach, one
that failed the whole group, an event it cannot make a message of. Each is one line, names
the downstream or the event, and quotes what the client said with the sink's secrets masked.
"""

from __future__ import annotations

from outbox.exceptions import DataError, DownstreamError, DownstreamUnavailableError
from outbox.sinks.secrets import Secrets, describe_error


def unavailable(
    downstream: str, error: BaseException, secrets: Secrets
) -> DownstreamUnavailableError:
    """The error a sink's ``connect`` raises for a downstream it cannot reach or that refuses
    it: one line, naming the downstream and what the client said, secrets masked."""
    return DownstreamUnavailableError(f"{downstream}: {describe_error(error, secrets)}")


def downstream_failed(downstream: str, error: BaseException, secrets: Secrets) -> DownstreamError:
    """The error a sink's ``send`` raises when the downstream failed the whole group (the
    connection lost, a timeout): one line, naming the downstream and what the client said,
    secrets masked."""
    return DownstreamError(f"{downstream}: {describe_error(error, secrets)}")


def not_a_message(event_id: object, error: BaseException, secrets: Secrets) -> DataError:
    """The error a sink raises for an event it cannot make a message of (a function of the
    user's raised, a value has no JSON form): the event's data, not the downstream, is at
    fault."""
    return DataError(f"event {event_id} cannot be made a message: {describe_error(error, secrets)}")
