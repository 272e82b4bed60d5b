"""A partitioned buffer table (PostgreSQL): claims take rows by id, not by address.

A claim normally updates the rows its locking CTE picked at their addresses (``ctid``), but a
``ctid`` is unique only within one partition: the first row of every partition is ``(0,1)``.
On a partitioned buffer the claim must fall back to ids, or it would stamp rows of other
partitions that merely share an address with the ones it locked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, String, create_engine, func, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox
from outbox._db import postgresql
from outbox._engine import claimer
from outbox.buffer import add_events
from outbox.testing import drain
from tests.models import ActivityEvent

TABLE = "test_partitioned_events"
SPLIT = 1_000
"""Ids below go to the first partition, the others to the second."""


class Base(DeclarativeBase):
    pass


class PartitionedEvent(BufferMixin, Base):
    __tablename__ = TABLE
    __table_args__ = (
        *BufferMixin.buffer_indexes(TABLE),
        {"postgresql_partition_by": "RANGE (id)"},
    )
    note: Mapped[str] = mapped_column(String(16), default="ping")


@pytest.fixture
def partitioned(postgres_database: str) -> Iterator[Engine]:
    """The partitioned buffer with two partitions, 10 events in each (ids 1-10 and 1001-1010):
    each partition's rows sit at the same addresses, (0,1) to (0,10)."""
    engine = create_engine(postgres_database)
    with engine.begin() as conn:
        Base.metadata.drop_all(conn)
        Base.metadata.create_all(conn)
        for name, bounds in (
            ("low", f"(MINVALUE) TO ({SPLIT})"),
            ("high", f"({SPLIT}) TO (MAXVALUE)"),
        ):
            conn.execute(
                text(f"CREATE TABLE {TABLE}_{name} PARTITION OF {TABLE} FOR VALUES FROM {bounds}")
            )
        add_events(conn, PartitionedEvent, [{"id": i} for i in range(1, 11)])
        add_events(conn, PartitionedEvent, [{"id": SPLIT + i} for i in range(1, 11)])
    yield engine
    with engine.begin() as conn:
        Base.metadata.drop_all(conn)
    engine.dispose()


def stamped_ids(engine: Engine) -> list[int]:
    """Ids of the partitioned buffer's claimed rows."""
    with engine.connect() as conn:
        query = select(PartitionedEvent.id).where(PartitionedEvent.group_id.is_not(None))
        return sorted(conn.execute(query).scalars())


def test_a_partitioned_buffer_is_not_addressable_a_plain_one_is(
    postgres_database: str, partitioned: Engine
) -> None:
    """The claim asks PostgreSQL what the table is: a partitioned one takes the join by id."""
    with partitioned.connect() as conn:
        assert (False, True) == (
            postgresql.addressable(conn, PartitionedEvent.__table__),  # type: ignore[arg-type]
            postgresql.addressable(conn, ActivityEvent.__table__),  # type: ignore[arg-type]
        )


def test_claim_by_address_would_stamp_rows_of_another_partition(partitioned: Engine) -> None:
    """Why the fallback: the same claim by address stamps the 5 oldest rows and the 5 rows of
    the other partition at the same addresses."""
    table = PartitionedEvent.__table__
    by_address = postgresql.claimable(table, 5, by_address=True)  # type: ignore[arg-type]
    claim = update(table).where(by_address).values(group_id=uuid.uuid4())
    with partitioned.connect() as conn:
        stamped = sorted(conn.execute(claim.returning(table.c.id)).scalars())
        conn.rollback()  # a demonstration: nothing of it stays
    assert [1, 2, 3, 4, 5, SPLIT + 1, SPLIT + 2, SPLIT + 3, SPLIT + 4, SPLIT + 5] == stamped


def test_claim_on_a_partitioned_buffer_takes_only_the_oldest_rows(
    make_app: Callable[[str], Outbox], postgres_database: str, partitioned: Engine
) -> None:
    app = make_app(postgres_database)
    app.handler(PartitionedEvent, name="ping", batch_size=5)(lambda batch: None)
    claim = claimer.run_once(app, app.get_handler("ping"))
    assert (5, [1, 2, 3, 4, 5]) == (claim.size if claim else 0, stamped_ids(partitioned))


def test_a_partitioned_buffer_drains_in_groups_within_the_batch_size(
    make_app: Callable[[str], Outbox], postgres_database: str, partitioned: Engine
) -> None:
    """Claim jobs (one statement that claims and creates the batch job) fall back to ids too:
    every event is handled once, in groups of at most the batch size."""
    handled: list[list[int]] = []

    def record(batch: Batch[Any]) -> None:
        handled.append(batch.ids)

    app = make_app(postgres_database)
    app.handler(PartitionedEvent, name="ping", batch_size=4)(record)
    drain(app)
    with partitioned.connect() as conn:
        left = conn.execute(select(func.count()).select_from(PartitionedEvent)).scalar_one()
    assert (
        [*range(1, 11), *range(SPLIT + 1, SPLIT + 11)],
        [],
        0,
    ) == (
        sorted(i for ids in handled for i in ids),
        [ids for ids in handled if len(ids) > 4],
        left,
    )
