"""How the ready consumers of :mod:`outbox.inbox` check what they are given: the effect (sync
or async, as the consumer calls it), the counts and durations with their bounds, and the
database; each refusal a :class:`ConfigurationError` in one line naming the argument."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from outbox.exceptions import ConfigurationError

if TYPE_CHECKING:
    from outbox.app import Outbox


def check_effect(effect: object, *, want_async: bool, consumer: str) -> None:
    """Refuse, in one line naming it, an effect that is not callable, or that is a coroutine
    function where a sync one is called (or the other way round)."""
    name = getattr(effect, "__qualname__", None) or type(effect).__name__
    if not callable(effect):
        raise ConfigurationError(f"{consumer}: effect must be a function, got {name}")
    is_async = inspect.iscoroutinefunction(effect) or inspect.iscoroutinefunction(
        getattr(effect, "__call__", None)  # noqa: B004 (an object whose __call__ is async)
    )
    if want_async and not is_async:
        raise ConfigurationError(
            f"{consumer}: effect {name} is a sync function; this consumer awaits its effect "
            "with an AsyncSession: make it `async def`"
        )
    if not want_async and is_async:
        raise ConfigurationError(
            f"{consumer}: effect {name} is an async function; this consumer calls its effect "
            "with a Session in a sync transaction: make it a plain `def`"
        )


MAX_BATCH_SIZE = 10_000
"""The largest ``batch_size``: within RabbitMQ's prefetch (65,535), and a batch one transaction
and one broker call hold comfortably (Redis's ``COUNT``, JetStream's fetch)."""
MAX_DELIVERIES_BOUND = 1_000
"""The largest ``max_deliveries``."""
MAX_PRUNE_CHUNKS = 10_000
"""The largest ``prune_chunks``."""
MAX_SECONDS = 86_400.0
"""The longest pause or interval a consumer takes (``failure_pause``, ``claim_idle``,
``ack_wait``, ``prune_interval``): a day."""
_COUNT_MAXIMA = {
    "batch_size": MAX_BATCH_SIZE,
    "max_deliveries": MAX_DELIVERIES_BOUND,
    "prune_chunks": MAX_PRUNE_CHUNKS,
}


def check_settings(consumer: str, **values: float) -> None:
    """Refuse, in one line naming it, a count (``batch_size``, ``max_deliveries``,
    ``prune_chunks``) that is not a whole number from 1 to its maximum, or a duration in
    seconds that is not a finite number above 0 and at most :data:`MAX_SECONDS`."""
    for name, value in values.items():
        number = not isinstance(value, bool) and isinstance(value, int | float)
        maximum = _COUNT_MAXIMA.get(name)
        if maximum is not None:
            if not number or not 1 <= value <= maximum or value != int(value):
                raise ConfigurationError(
                    f"{consumer}: {name} must be a whole number from 1 to {maximum}, got {value!r}"
                )
        elif not number or not 0 < value <= MAX_SECONDS:
            raise ConfigurationError(
                f"{consumer}: {name} must be seconds, more than 0 and at most "
                f"{MAX_SECONDS:.0f}, got {value!r}"
            )


def sync_engine(database: Outbox | Engine, consumer: str) -> Engine:
    """The engine of an Outbox application, or the engine given."""
    if isinstance(database, Engine):
        return database
    engine = getattr(database, "engine", None)
    if isinstance(engine, Engine):
        return engine
    raise ConfigurationError(
        f"{consumer}: database must be an Outbox application or an Engine, got "
        f"{type(database).__name__}"
    )
