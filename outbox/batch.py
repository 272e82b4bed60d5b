"""Batch: what a handler receives, and how it reports partial failure."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from outbox.buffer import BufferMixin

EventT = TypeVar("EventT", bound=BufferMixin)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Events a handler singled out, with the reason it gave."""

    event_ids: tuple[int, ...]
    reason: str


@dataclass
class Batch(Generic[EventT]):
    """One group of events, handed to a handler in bulk.

    ``events`` are the group's rows as model instances, ordered by id, detached from any
    session. ``attempt`` is 1 on the first try. Returning normally from the handler means every
    event succeeded except those passed to :meth:`retry` or :meth:`discard`; raising means the
    whole group failed this attempt.

    ``group_id`` makes a natural idempotency key for a downstream bulk call: a group's events
    never change between attempts. ``attempt`` does not belong in the key: it grows with every
    try, including the one after a crash, exactly when the downstream must see a repeat.
    """

    events: Sequence[EventT]
    group_id: uuid.UUID
    attempt: int
    handler: str
    _retried: list[Outcome] = field(default_factory=list, repr=False)
    _discarded: list[Outcome] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[EventT]:
        return iter(self.events)

    def retry(self, events: Iterable[EventT], reason: str) -> None:
        """Take ``events`` out of this group: they are retried later in a group of their own.

        The new group continues this group's attempt count and follows the same backoff; once
        the attempts are spent, the events are dead-lettered.
        """
        self._retried.append(Outcome(self._ids_of(events), reason))

    def discard(self, events: Iterable[EventT], reason: str) -> None:
        """Take ``events`` out of this group: they are archived as ``discarded`` now."""
        self._discarded.append(Outcome(self._ids_of(events), reason))

    @property
    def retried_ids(self) -> dict[int, str]:
        """Ids passed to :meth:`retry`, with their reason (an id discarded too is discarded)."""
        discarded = self.discarded_ids
        return {i: o.reason for o in self._retried for i in o.event_ids if i not in discarded}

    @property
    def discarded_ids(self) -> dict[int, str]:
        """Ids passed to :meth:`discard`, with their reason."""
        return {i: o.reason for o in self._discarded for i in o.event_ids}

    def _ids_of(self, events: Iterable[EventT]) -> tuple[int, ...]:
        mine = {e.id for e in self.events}
        ids = tuple(e.id for e in events)
        strangers = [i for i in ids if i not in mine]
        if strangers:
            raise ValueError(f"events {strangers[:5]} are not in group {self.group_id}")
        return ids
