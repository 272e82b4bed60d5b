"""Batch: what a handler receives, and how it reports partial failure."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar

from sqlalchemy import inspect
from sqlalchemy.orm import attributes, configure_mappers

from outbox.buffer import BufferMixin

EventT = TypeVar("EventT", bound=BufferMixin)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Events a handler singled out, with the reason it gave."""

    event_ids: tuple[int, ...]
    reason: str


class Batch(Generic[EventT]):
    """One group of events, handed to a handler in bulk.

    ``events`` are the group's rows as model instances, ordered by id, detached from any
    session; they are built on first access, so a handler that only needs ``ids`` or ``rows``
    pays no per-row object construction. ``rows`` are the same rows as SQLAlchemy ``Row``
    tuples (attribute access by column name). ``attempt`` is 1 on the first try. Returning
    normally from the handler means every event succeeded except those passed to
    :meth:`retry` or :meth:`discard`; raising means the whole group failed this attempt.

    ``group_id`` makes a natural idempotency key for a downstream bulk call: a group's events
    never change between attempts. ``attempt`` does not belong in the key: it grows with every
    try, including the one after a crash, exactly when the downstream must see a repeat.
    """

    def __init__(
        self,
        events: Sequence[EventT] | None = None,
        *,
        group_id: uuid.UUID,
        attempt: int,
        handler: str,
        rows: Sequence[Any] | None = None,
        model: type[EventT] | None = None,
    ) -> None:
        if (events is None) == (rows is None) or (rows is not None and model is None):
            raise ValueError("a Batch takes either events, or rows with their model")
        self.group_id = group_id
        self.attempt = attempt
        self.handler = handler
        self._events = None if events is None else list(events)
        self._rows = rows
        self._model = model
        self._retried: list[Outcome] = []
        self._discarded: list[Outcome] = []

    def __repr__(self) -> str:
        return (
            f"Batch(handler={self.handler!r}, group_id={self.group_id}, "
            f"attempt={self.attempt}, size={len(self)})"
        )

    @property
    def events(self) -> Sequence[EventT]:
        """The events as model instances, ordered by id (built on first access)."""
        if self._events is None:
            assert self._rows is not None
            assert self._model is not None
            self._events = _instances(self._model, self._rows)
        return self._events

    @property
    def rows(self) -> Sequence[Any]:
        """The events as ``Row`` tuples, ordered by id: the cheapest way to read them."""
        if self._rows is not None:
            return self._rows
        return self.events

    @property
    def ids(self) -> list[int]:
        """The events' ids, ordered."""
        return [int(i) for i in column_values(self.rows, "id")]

    def __len__(self) -> int:
        return len(self._rows if self._rows is not None else self.events)

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
        mine = set(self.ids)
        ids = tuple(e.id for e in events)
        strangers = [i for i in ids if i not in mine]
        if strangers:
            raise ValueError(f"events {strangers[:5]} are not in group {self.group_id}")
        return ids


def column_values(rows: Sequence[Any], name: str) -> list[Any]:
    """One column of rows (``Row`` tuples or model instances), in order.

    A ``Row`` is read by position: by name, its attribute lookup costs about twenty times as
    much, which is a visible part of a thousand-row batch.
    """
    if not rows:
        return []
    fields = getattr(rows[0], "_fields", None)
    getter = attrgetter(name) if fields is None else itemgetter(fields.index(name))
    return list(map(getter, rows))


def _instances(model: type[EventT], rows: Sequence[Any]) -> list[EventT]:
    """Detached model instances from rows of all the table's columns, in table order.

    Lighter than the ORM's loading (no session, no identity map): the attribute values go
    straight into each instance's ``__dict__``, and each gets its identity key, so that it is
    *detached* (loaded from the database) rather than *transient* (new).
    """
    configure_mappers()  # instrumentation is complete only once the mappers are configured
    mapper = inspect(model)
    keys = [mapper.get_property_by_column(column).key for column in mapper.local_table.columns]
    new_instance = mapper.class_manager.new_instance
    result = []
    for row in rows:
        instance = new_instance()
        instance.__dict__.update(zip(keys, row, strict=True))
        state = attributes.instance_state(instance)
        state.key = mapper.identity_key_from_primary_key((instance.__dict__["id"],))
        result.append(instance)
    return result
