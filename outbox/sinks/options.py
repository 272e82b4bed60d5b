"""Sink options given per event: once for every event, or as a function of the event (a
subject, a stream, a routing key that depends on the event's columns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from outbox.exceptions import ConfigurationError

T = TypeVar("T")

PerEvent: TypeAlias = T | Callable[[Any], T]
"""A sink option given once for every event, or a function of the event (its columns)."""


def per_event(option: PerEvent[T], event: Any) -> T:
    """The option's value for ``event``: the value, or what the function returns for it."""
    if callable(option):
        return option(event)
    return option


def check_per_event(name: str, option: object) -> None:
    """Refuse, naming it, a :data:`PerEvent` text option that is neither a string nor a
    function of the event."""
    if not (isinstance(option, str) or callable(option)):
        raise ConfigurationError(
            f"{name}: expected a string or a function of the event, got {type(option).__name__}"
        )
