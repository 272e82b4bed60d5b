"""Flags on a business table: the keys of flagged rows copied into their handler's buffer, the
flags cleared for the rows a group handled (see :mod:`outbox.flags`), and the flagged rows
counted for an operator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, String, Table, cast, exists, func, select, tuple_, update
from sqlalchemy.sql import ColumnElement

from outbox._db import dialects

# The longest version text a flag buffer keeps, when its column does not say.
SEEN_LENGTH = 100


def seen_text(version: ColumnElement[Any], length: int) -> ColumnElement[str]:
    """A row's version as the buffer shows it (for the operator: the clear compares the
    version handed over, as its column's type): as text, cut to the column's ``length``."""
    return func.substr(cast(version, String), 1, length)


def pump_flagged_rows(
    conn: Connection,
    dialect: str,
    buffer: Table,
    source: Table,
    flagged: ColumnElement[bool],
    version: ColumnElement[Any],
    limit: int,
) -> int:
    """Copy the keys of up to ``limit`` rows of ``source`` that are ``flagged`` and that the
    buffer does not hold yet into it, each with its ``version`` as it is now, oldest key first;
    how many were copied. A key another copy put in meanwhile is skipped."""
    key = source.c.id
    pending = exists().where(buffer.c.row_id == key)
    length = getattr(buffer.c.seen.type, "length", None) or SEEN_LENGTH
    picked = (
        select(key, seen_text(version, length)).where(flagged, ~pending).order_by(key).limit(limit)
    )
    statements = dialects.statements(dialect)
    return statements.insert_selected_ignoring_duplicates(conn, buffer, ["row_id", "seen"], picked)


@dataclass(frozen=True, slots=True)
class FlaggedCount:
    """The flagged rows of a business table, read at a bounded cost
    (:func:`count_flagged_rows`)."""

    flagged: int
    """Flagged rows, counted no further than the cap."""
    waiting: int
    """Of those, the rows whose key the buffer does not hold: the next distribution takes
    them."""


def count_flagged_rows(
    conn: Connection,
    buffer: Table,
    source: Table,
    flagged: ColumnElement[bool],
    cap: int | None,
) -> FlaggedCount:
    """The rows of ``source`` that are ``flagged`` (up to ``cap`` of them; None: all), and how
    many of those the buffer holds no key of, in one statement.

    The walk of the flagged rows is the distribution's (the flag's index, by key), from the
    highest key down: the distribution takes the lowest keys first, so past the cap the rows
    walked are those least likely taken, and the count of waiting ones says "at least" with
    the fewest left out. Each walked row is one probe of the buffer's unique ``row_id``
    index (a LEFT JOIN: ``row_id`` is unique, so a row joins at most one key); where the
    buffer is small next to the walk, PostgreSQL hashes it instead, which its planner finds
    cheaper than the probes: the probes bound the cost either way."""
    key = source.c.id
    walked = select(key.label("id")).where(flagged).order_by(key.desc())
    if cap is not None:
        walked = walked.limit(cap)
    rows = walked.subquery("flagged_rows")
    counted = select(func.count(), func.count(buffer.c.row_id)).select_from(
        rows.outerjoin(buffer, buffer.c.row_id == rows.c.id)
    )
    total, taken = conn.execute(counted).one()
    return FlaggedCount(flagged=int(total), waiting=int(total) - int(taken))


class Flags(Protocol):
    """A business table's flag (:class:`outbox.flags.FlagSource`)."""

    @property
    def table(self) -> Table: ...

    @property
    def flag(self) -> str: ...

    @property
    def cleared(self) -> Any: ...

    def version_column(self) -> ColumnElement[Any]: ...


def clear_flags(conn: Connection, flags: Flags, handed: Sequence[tuple[int, Any]]) -> int:
    """Clear the flag of the business rows ``handed`` (each a key and the version it was
    handed at) whose version is still that one; how many were cleared. A row changed since
    (a new version) keeps its flag, and is handled again. One statement, by primary key and
    version, each bound as its column's type: no text cast compares them."""
    if not handed:
        return 0
    source = flags.table
    picked = tuple_(source.c.id, flags.version_column()).in_(list(handed))
    statement = update(source).where(picked).values({flags.flag: flags.cleared})
    return int(conn.execute(statement).rowcount)
