"""Fan-out: one buffer the application writes, copied into a buffer per consumer.

:meth:`outbox.Outbox.fanout` registers the fan-out of a source buffer as a handler of its own
whose call does nothing: when one of its groups succeeds, its completion copies the group's
rows into every consumer's buffer in the transaction that deletes them from the source, each
copy under the event's own id and ``created_at``. Every consumer is then a buffer with a handler
like any other, with its own progress, retries, limits, dead letters and pause; see
docs/fanout.md for the guarantee and docs/design.md for why copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Column, Table

from outbox.batch import Batch
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler

# The copy's columns: every column of the source but the claim, which a copy starts without.
_NOT_COPIED = frozenset({"group_id"})


def copy_on_success(batch: Batch[Any]) -> None:
    """The fan-out's handler. The call has nothing to do: the group's completion writes the
    copies, in the transaction that removes the group from the source buffer."""


def copied_columns(source: Table) -> list[str]:
    """The names of the source's columns a copy carries (all but ``group_id``)."""
    return [column.name for column in source.columns if column.name not in _NOT_COPIED]


def checked_targets(
    source: type[Any], to: Sequence[type[Any]], handlers: Iterable[Handler[Any]]
) -> tuple[type[Any], ...]:
    """The consumers' buffer models, each checked against the source and the ``handlers``
    registered: a buffer model other than the source, given once, consumer of no other
    fan-out (their ids would collide), with every column of the source of the same kind and
    no column of its own that a copy could not leave empty. Refused in one line naming the
    model and the column."""
    if isinstance(to, type) or not isinstance(to, Sequence) or not to:
        raise ConfigurationError(
            f"fanout({_name(source)}): to must be a list of the consumers' buffer models, got "
            f"{to!r}"
        )
    source_table: Table = source.__table__
    taken = {model: handler.name for handler in handlers for model in handler.copy_to}
    seen: set[str] = set()
    for model in to:
        if not (isinstance(model, type) and issubclass(model, BufferMixin)):
            raise ConfigurationError(
                f"fanout({_name(source)}): {_name(model)!r} is not a buffer model: a consumer's "
                "model must inherit outbox.BufferMixin"
            )
        table = getattr(model, "__table__", None)
        if not isinstance(table, Table):
            raise ConfigurationError(f"fanout({_name(source)}): {_name(model)} has no table")
        if table is source_table:
            raise ConfigurationError(
                f"fanout({_name(source)}): {model.__name__} is the source itself, not a consumer"
            )
        if table.fullname in seen:
            raise ConfigurationError(
                f"fanout({_name(source)}): {model.__name__} ({table.fullname}) is given twice"
            )
        seen.add(table.fullname)
        if model in taken:
            raise ConfigurationError(
                f"fanout({_name(source)}): {model.__name__} is a consumer of {taken[model]!r} "
                "already: a consumer's buffer holds the copies of one source (ids would collide)"
            )
        _check_columns(source_table, table, model)
    return tuple(to)


def _check_columns(source: Table, target: Table, model: type[Any]) -> None:
    named = {column.name: column for column in target.columns}
    for name in copied_columns(source):
        column = named.get(name)
        if column is None:
            raise ConfigurationError(
                f"{model.__name__} ({target.name}) has no column {name!r}, which the copies of "
                f"{source.name}'s events carry: a consumer's buffer has every column of the source"
            )
        if column.type._type_affinity is not source.c[name].type._type_affinity:
            raise ConfigurationError(
                f"{model.__name__}.{name} is {column.type}, where {source.name}.{name} is "
                f"{source.c[name].type}: a copy keeps each value as the source holds it"
            )
    for column in target.columns:
        if column.name not in source.c and not _may_be_left_empty(column):
            raise ConfigurationError(
                f"{model.__name__}.{column.name} is not in {source.name} and has neither a "
                "default nor NULL: a copy of the source's events could not be written"
            )


def _may_be_left_empty(column: Column[Any]) -> bool:
    return bool(column.nullable or column.default is not None or column.server_default is not None)


def _name(model: object) -> str:
    return str(getattr(model, "__name__", model))
