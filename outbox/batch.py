"""Batch: what a handler receives, and how it reports partial failure."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar

from sqlalchemy import inspect
from sqlalchemy.orm import ClassManager, attributes, configure_mappers

from outbox._db.types import TupleRows
from outbox.retry import When, wait_seconds

# Events of a buffer, or (for a flag handler) rows of a business table.
EventT = TypeVar("EventT")


@dataclass(frozen=True, slots=True)
class Outcome:
    """Events a handler singled out, with the reason it gave."""

    event_ids: tuple[int, ...]
    reason: str
    after: float | None = None


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
        self._id_set: frozenset[int] | None = None
        self.handed: dict[int, Any] = {}
        """A flag handler's group: the version of each business row handed over, by its key
        (:mod:`outbox.flags`); empty for any other."""

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
        if isinstance(self._rows, TupleRows):
            return self._rows.rows()
        if self._rows is not None:
            return self._rows
        return self.events

    @property
    def ids(self) -> list[int]:
        """The events' ids, ordered."""
        # Read from the claim's tuples where it kept them: no Row is built for the ids.
        rows = self._rows if self._rows is not None else self.events
        return [int(i) for i in column_values(rows, "id")]

    def __len__(self) -> int:
        return len(self._rows if self._rows is not None else self.events)

    def __iter__(self) -> Iterator[EventT]:
        return iter(self.events)

    def retry(self, events: Iterable[EventT], reason: str, *, after: When | None = None) -> None:
        """Take ``events`` out of this group: they are retried later in a group of their own.

        The new group continues this group's attempt count and follows the same backoff; once
        the attempts are spent, the events are dead-lettered.

        ``after``: how long the downstream asked to wait for these events (a per-record rate
        limit, a Retry-After): seconds, a ``timedelta``, an aware ``datetime`` or the header's
        text, as :class:`outbox.RetryAfter` takes it, with the same floor (1 s) and default
        for unreadable text (30 s). They wait at least that long, and the attempt is not
        counted for them but deferred, up to ``RetryPolicy.max_deferrals``.

        Checked here: ``events`` must be events of this batch, ``reason`` a ``str``, and no
        event may also be discarded in this call (a ``TypeError`` or ``ValueError`` naming the
        argument; raised out of the handler, it fails the attempt). The same event retried
        twice is retried once, with the longest ``after``.
        """
        ids = self._ids_of(events, "retry")
        _check_reason(reason, "retry")
        wait = None if after is None else wait_seconds(after, "batch.retry: after")
        _refuse_both(ids, self.discarded_ids, "retry", "discarded")
        self._retried.append(Outcome(ids, reason, wait))

    def discard(self, events: Iterable[EventT], reason: str) -> None:
        """Take ``events`` out of this group: they are archived as ``discarded`` now, with
        ``reason`` (a ``str``) as their error. Checked as :meth:`retry` checks its arguments;
        an event retried in this call cannot be discarded too."""
        ids = self._ids_of(events, "discard")
        _check_reason(reason, "discard")
        _refuse_both(ids, {i for o in self._retried for i in o.event_ids}, "discard", "retried")
        self._discarded.append(Outcome(ids, reason))

    @property
    def retried_ids(self) -> dict[int, str]:
        """Ids passed to :meth:`retry`, with their reason."""
        return {i: o.reason for o in self._retried for i in o.event_ids}

    @property
    def deferred_ids(self) -> dict[int, float]:
        """Ids passed to :meth:`retry` with ``after``, with the longest wait asked for each
        (an id also retried without ``after`` is not deferred)."""
        plain = {i for o in self._retried if o.after is None for i in o.event_ids}
        deferred: dict[int, float] = {}
        for outcome in self._retried:
            if outcome.after is None:
                continue
            for i in outcome.event_ids:
                if i not in plain:
                    deferred[i] = max(deferred.get(i, 0.0), outcome.after)
        return deferred

    @property
    def discarded_ids(self) -> dict[int, str]:
        """Ids passed to :meth:`discard`, with their reason."""
        return {i: o.reason for o in self._discarded for i in o.event_ids}

    def _ids_of(self, events: Iterable[EventT], method: str) -> tuple[int, ...]:
        if isinstance(events, str | bytes | Mapping) or not isinstance(events, Iterable):
            raise TypeError(
                f"batch.{method}: events must be an iterable of this batch's events, "
                f"got {type(events).__qualname__}"
            )
        if self._id_set is None:
            self._id_set = frozenset(self.ids)
        mine = self._id_set
        try:
            ids = tuple(getattr(e, "id") for e in events)  # noqa: B009 - any model's id
        except AttributeError:
            raise TypeError(
                f"batch.{method}: events must be this batch's events (with an id), "
                "not ids or other values"
            ) from None
        strangers = [i for i in ids if i not in mine]
        if strangers:
            raise ValueError(
                f"batch.{method}: events {strangers[:5]} are not in group {self.group_id}"
            )
        return ids


def _refuse_both(ids: tuple[int, ...], taken: Iterable[int], method: str, as_: str) -> None:
    # One event, two outcomes: neither is what the handler meant, so neither is guessed.
    both = sorted(set(ids).intersection(taken))
    if both:
        raise ValueError(
            f"batch.{method}: events {both[:5]} were already {as_} in this call; "
            "an event is either retried or discarded"
        )


def _check_reason(reason: object, method: str) -> None:
    if not isinstance(reason, str):
        raise TypeError(f"batch.{method}: reason must be a str, got {type(reason).__qualname__}")


def column_values(rows: Sequence[Any], name: str) -> list[Any]:
    """One column of rows (``Row`` tuples or model instances), in order.

    A ``Row`` is read by position: by name, its attribute lookup costs about twenty times as
    much, which is a visible part of a thousand-row batch.
    """
    if not rows:
        return []
    if isinstance(rows, TupleRows):
        return list(map(itemgetter(rows.fields.index(name)), rows.tuples))
    fields = getattr(rows[0], "_fields", None)
    getter = attrgetter(name) if fields is None else itemgetter(fields.index(name))
    return list(map(getter, rows))


def _instances(model: type[EventT], rows: Sequence[Any]) -> list[EventT]:
    """Detached model instances from rows of all the table's columns, in table order.

    Lighter than the ORM's loading (no session, no identity map): the attribute values go
    straight into each instance's ``__dict__``, and each gets its identity key, so that it is
    *detached* (loaded from the database) rather than *transient* (new).

    This runs for every event a handler reads through ``events``, so the loop does per row
    only what ``ClassManager.new_instance`` does (the instance and its state) and sets the
    key and the values; whatever is the same for every row is looked up once per batch. A
    class with instrumentation of its own (``__sa_instrumentation_manager__``) keeps state and
    values where its manager says: its instances are built through the manager.
    """
    configure_mappers()  # instrumentation is complete only once the mappers are configured
    mapper = inspect(model)
    columns = list(mapper.local_table.columns)
    if isinstance(rows, TupleRows):
        # The claim's tuples, not made rows: each may end with values past the table's
        # columns, which the values' zip below leaves out.
        if len(rows.fields) != len(columns):
            raise ValueError(
                f"rows of {len(rows.fields)} columns for the {len(columns)} of {model}"
            )
        rows = rows.tuples
        checked = True
    else:
        checked = False
    keys = [mapper.get_property_by_column(column).key for column in columns]
    # An identity key is (class, primary key values, token): class and token are the same for
    # every row; the values are each row's, as tuples.
    key_class, _, token = mapper.identity_key_from_primary_key([None] * len(mapper.primary_key))
    positions = [next(i for i, c in enumerate(columns) if c is key) for key in mapper.primary_key]
    identities = zip(*(map(itemgetter(i), rows) for i in positions), strict=True)
    manager = mapper.class_manager
    result: list[EventT] = []
    if type(manager) is not ClassManager:
        for row, identity in zip(rows, identities, strict=True):
            instance = manager.new_instance()
            attributes.instance_dict(instance).update(zip(keys, row[: len(keys)], strict=True))
            attributes.instance_state(instance).key = (key_class, identity, token)
            result.append(instance)
        return result
    cls = mapper.class_
    new = cls.__new__
    make_state = manager._state_constructor
    state_attribute = manager.STATE_ATTR
    append = result.append
    if rows and not checked and len(rows[0]) != len(keys):
        # Every row of a batch comes from one statement: checked once, not row by row (a zip
        # given ``strict=`` costs a call with keywords, a visible share of each row's cost).
        raise ValueError(f"rows of {len(rows[0])} values for the {len(keys)} columns of {cls}")
    for row, identity in zip(rows, identities, strict=True):
        instance = new(cls)
        state = make_state(instance, manager)
        state.key = (key_class, identity, token)
        values = instance.__dict__
        values[state_attribute] = state
        values.update(zip(keys, row))  # noqa: B905 - the rows' length is checked above
        append(instance)
    return result
