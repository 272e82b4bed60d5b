"""Flags on a business table: rows the application marks as needing work, handled in bulk with
claims, leases, retries, dead letters and several workers, as events of a buffer are.

The application flips a flag on its own rows (``employee.needs_sync``) and bumps a version
with every change. :meth:`outbox.Outbox.flagged` registers a handler of those rows. Its buffer
(a :class:`FlaggedRowsMixin` model, which the application creates and never writes) holds the
key of each flagged row outbox is working on, with the version it saw: each distribution copies
the keys of newly flagged rows into it, and from there they are claimed and leased as any
buffer's events. The handler is handed the business rows themselves, read when its group runs.
When it succeeds, the flag of each row is cleared in the transaction that records the success,
only where the row's version is still the one it was handed at: a row changed meanwhile stays
flagged and is handled again. See docs/flags.md for the guarantee.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Boolean, Column, Index, String, Table, select, true
from sqlalchemy.orm import Mapped, declared_attr, mapped_column
from sqlalchemy.sql import ColumnElement

from outbox._core import handler_kind
from outbox.batch import Batch
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy import Engine

# The column of the buffer that names the business row (its primary key).
ROW_KEY = "row_id"
_SEEN_LENGTH = 100


class FlaggedRowsMixin(BufferMixin):
    """Declarative mixin for the buffer of a flag handler (:meth:`outbox.Outbox.flagged`).

    Besides the buffer's own columns it has ``row_id``, the primary key of the flagged row
    (unique: a row is worked on once at a time), and ``seen``, the version of the row when its
    key was taken. The application creates the table with its migrations and never writes it.
    """

    row_id: Mapped[int] = mapped_column(BigInteger(), nullable=False)
    seen: Mapped[str | None] = mapped_column(String(_SEEN_LENGTH), nullable=True)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:  # noqa: N805 - a declared_attr takes the class
        name = cls.__tablename__  # type: ignore[attr-defined]
        return (
            *BufferMixin.buffer_indexes(name),
            Index(f"ux_{name}_{ROW_KEY}", ROW_KEY, unique=True),
            BufferMixin.buffer_options(),
        )


@dataclass(frozen=True, slots=True)
class FlagSource:
    """Where a flag handler's rows come from: the business ``model``, its ``flag`` column and
    ``version`` column (names in the table), and the value that clears the flag."""

    model: type[Any]
    flag: str
    version: str
    cleared: Any

    @property
    def table(self) -> Table:
        """The business table."""
        return self.model.__table__  # type: ignore[no-any-return]

    def flagged(self) -> ColumnElement[bool]:
        """The condition of a flagged row: a true flag, or a flag that is set (not NULL)."""
        column = self.table.c[self.flag]
        if self.cleared is False:
            return column == true()
        return column.is_not(None)

    def version_column(self) -> Column[Any]:
        """The column whose value tells one change of a row from the next."""
        return self.table.c[self.version]


def flag_source(model: type[Any], flag: str, version: str | None) -> FlagSource:
    """The flag of ``model``, checked where it is given: a mapped model whose primary key is
    one integer column ``id``, a ``flag`` column that is a boolean (then ``version`` names the
    column that every change moves: a row flagged again while it is handled is otherwise not
    told from one that was not) or a nullable column that is set when the row needs work and
    NULL when it does not (its value is then its version too). Refused in one line naming the
    model and the column."""
    table = getattr(model, "__table__", None)
    if not isinstance(table, Table):
        raise ConfigurationError(f"flagged: {model!r} is not a mapped model (no __table__)")
    keys = list(table.primary_key.columns)
    if [c.name for c in keys] != ["id"] or keys[0].type.python_type is not int:
        raise ConfigurationError(
            f"flagged({model.__name__}): the primary key must be one integer column named id, "
            f"got {', '.join(c.name for c in keys) or 'none'}"
        )
    columns = {c.name: c for c in table.columns}
    for option, name in (("flag", flag), ("version", version)):
        if name is not None and name not in columns:
            raise ConfigurationError(
                f"flagged({model.__name__}): {option} must name a column of {table.name!r}, "
                f"got {name!r}"
            )
    if isinstance(columns[flag].type, Boolean):
        if version is None:
            raise ConfigurationError(
                f"flagged({model.__name__}): {flag} is a boolean, so version must name the "
                "column every change moves (a counter, or an updated-at time): without it, a "
                "row changed while it is handled would have its flag cleared"
            )
        return FlagSource(model, flag, version, False)
    if not columns[flag].nullable:
        raise ConfigurationError(
            f"flagged({model.__name__}): {flag} must be a boolean, or a nullable column set "
            "when the row needs work and NULL when it does not"
        )
    return FlagSource(model, flag, version or flag, None)


def checked_buffer(model: type[Any], buffer: type[Any]) -> type[Any]:
    """The flag handler's buffer model, which must be a :class:`FlaggedRowsMixin` model."""
    if not (isinstance(buffer, type) and issubclass(buffer, FlaggedRowsMixin)):
        raise ConfigurationError(
            f"flagged({model.__name__}): buffer must be a model of outbox.FlaggedRowsMixin, "
            f"got {buffer!r}"
        )
    return buffer


def rows_handler(
    engine: Callable[[], Engine],
    source: FlagSource,
    func: Callable[[Batch[Any]], Awaitable[None] | None],
) -> Callable[[Batch[Any]], Awaitable[None] | None]:
    """The function the engine calls with a group of the buffer: it reads the business rows
    the group names and calls ``func`` with them as a batch of the business model; the rows'
    retries, deferrals and discards become the group's. A row deleted since it was flagged is
    not handed over: there is nothing left to work on. ``engine``: the application's, asked
    when a group runs."""

    def business_batch(outer: Batch[Any]) -> tuple[Batch[Any], dict[int, Any]]:
        by_row = {int(row.row_id): row for row in outer.events}
        table = source.table
        with engine().connect() as conn:
            rows = conn.execute(
                select(table).where(table.c.id.in_(list(by_row))).order_by(table.c.id)
            ).all()
        inner = Batch(
            group_id=outer.group_id,
            attempt=outer.attempt,
            handler=outer.handler,
            rows=rows,
            model=source.model,
        )
        # The versions handed over, which the group's success clears the flags of.
        version = source.version_column()
        outer.handed = {int(row.id): row._mapping[version] for row in rows}
        return inner, by_row

    if handler_kind.is_async(func):

        async def handle_async(outer: Batch[Any]) -> None:
            inner, by_row = await asyncio.to_thread(business_batch, outer)
            if len(inner):
                await func(inner)  # type: ignore[misc]
            _carry_outcomes(inner, outer, by_row)

        return handle_async

    def handle(outer: Batch[Any]) -> None:
        inner, by_row = business_batch(outer)
        if len(inner):
            func(inner)
        _carry_outcomes(inner, outer, by_row)

    return handle


def _carry_outcomes(inner: Batch[Any], outer: Batch[Any], by_row: dict[int, Any]) -> None:
    deferred = inner.deferred_ids
    for row_id, reason in inner.retried_ids.items():
        outer.retry([by_row[row_id]], reason, after=deferred.get(row_id))
    for row_id, reason in inner.discarded_ids.items():
        outer.discard([by_row[row_id]], reason)


def done_rows(batch: Batch[Any], retried: Sequence[int]) -> list[tuple[int, Any]]:
    """The business rows of a group whose flags its success clears, each with the version it
    was handed at: all those handed over but the ones retried or deferred (a discarded row was
    dealt with: the handler chose to drop it)."""
    again = set(retried)
    handed = batch.handed
    return [
        (int(e.row_id), handed[int(e.row_id)])
        for e in batch.events
        if e.id not in again and int(e.row_id) in handed
    ]
