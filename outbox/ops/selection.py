"""A *selection* (:class:`Selection`): which groups an operator means, the filter every listing
and every operation on groups takes (handlers, statuses, age, error text, ordering key, payload
text, group ids), built the same way by every face.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from outbox._core.checks import text_problem
from outbox.exceptions import ConfigurationError
from outbox.schema import GroupStatus

__all__ = ["MAX_AGE_SECONDS", "Selection", "checked_text", "parse_statuses"]

MAX_AGE_SECONDS = 100 * 365.25 * 86_400
"""The oldest ``older_than`` a selection takes: further back, the time is past what every
database computes."""


def parse_statuses(words: Iterable[str], *, argument: str = "status") -> tuple[GroupStatus, ...]:
    """Words as :class:`~outbox.schema.GroupStatus` values (``in-flight`` and ``in_flight``
    alike); a :class:`~outbox.exceptions.ConfigurationError` naming ``argument`` and the
    accepted words for any other."""
    known = {s.value: s for s in GroupStatus}
    found = []
    for word in words:
        if not isinstance(word, str):
            raise ConfigurationError(f"{argument}: expected a word, got {type(word).__name__}")
        status = known.get(word.strip().lower().replace("-", "_"))
        if status is None:
            raise ConfigurationError(
                f"{argument}: {word!r} is not a group status; expected one of {', '.join(known)}"
            )
        found.append(status)
    return tuple(dict.fromkeys(found))


def checked_text(value: str | None, argument: str) -> str | None:
    """``value`` when it is some text (None stays None); a ConfigurationError naming
    ``argument`` otherwise."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{argument}: expected some text, got {value!r}")
    problem = text_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{argument}: {problem}")
    return value


@dataclass(frozen=True, slots=True)
class Selection:
    """Which groups: each field narrows the selection; left empty, it does not.

    ``statuses``: :class:`~outbox.schema.GroupStatus` values or their words; ``older_than``:
    seconds since the group was made (a dead one: since it was archived); ``error``: text in
    its last error, any case; ``key``: an ordering key's value, as text (handlers with an
    ``ordering_key`` only); ``payload``: text in a dead event's payload, any case.
    """

    handlers: tuple[str, ...] = ()
    statuses: tuple[GroupStatus, ...] = ()
    older_than: float | None = None
    error: str | None = None
    key: str | None = None
    payload: str | None = None
    group_ids: tuple[uuid.UUID, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.handlers, str) or not all(isinstance(h, str) for h in self.handlers):
            raise ConfigurationError("handlers: expected a tuple of handler names")
        object.__setattr__(self, "handlers", tuple(self.handlers))
        object.__setattr__(self, "statuses", parse_statuses(self.statuses, argument="statuses"))
        if self.older_than is not None and (
            isinstance(self.older_than, bool)
            or not isinstance(self.older_than, int | float)
            # Infinite or NaN: no time the database can subtract from now.
            or not 0 <= self.older_than < math.inf
        ):
            raise ConfigurationError(
                f"older_than: expected a finite number of seconds >= 0, got {self.older_than!r}"
            )
        if self.older_than is not None and self.older_than > MAX_AGE_SECONDS:
            raise ConfigurationError(
                f"older_than: expected at most {MAX_AGE_SECONDS:.0f} seconds (100 years),"
                f" got {self.older_than!r}"
            )
        checked_text(self.error, "error")
        checked_text(self.key, "key")
        checked_text(self.payload, "payload")
        ids = tuple(self.group_ids)
        if not all(isinstance(g, uuid.UUID) for g in ids):
            raise ConfigurationError("group_ids: expected UUIDs")
        object.__setattr__(self, "group_ids", ids)

    @property
    def empty(self) -> bool:
        """Nothing narrows it: every group."""
        return self == Selection()

    def as_json(self) -> str:
        """The selection as JSON, as an operation records it."""
        given: dict[str, Any] = {
            "handlers": list(self.handlers),
            "statuses": [s.value for s in self.statuses],
            "older_than": self.older_than,
            "error": self.error,
            "key": self.key,
            "payload": self.payload,
            "group_ids": [str(g) for g in self.group_ids],
        }
        return json.dumps({k: v for k, v in given.items() if v not in (None, [])}, sort_keys=True)
