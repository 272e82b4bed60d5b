"""Keyed groups (``group_by``): each group holds the events of one key, and claims take the
keys in turn, so that one key's backlog cannot hold up the others. On SQLite, PostgreSQL and
MariaDB."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, Index, String, insert, select, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, ConfigurationError, Outbox, RateLimit, RetryPolicy, schema
from outbox._db.dialects import db_now_plus
from outbox._engine import claimer, distributor
from outbox.ops import holds
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent


class Base(DeclarativeBase):
    """This test's own buffer."""


class AccountEvent(BufferMixin, Base):
    __tablename__ = "test_account_events"
    account: Mapped[str | None] = mapped_column(String(40))
    # What a keyed buffer wants: the unclaimed rows by key.
    __table_args__ = (
        Index(
            "ix_test_account_events_unclaimed_account",
            "account",
            "id",
            postgresql_where=text("group_id IS NULL"),
            sqlite_where=text("group_id IS NULL"),
        ),
    )


class RenamedEvent(BufferMixin, Base):
    """A key whose attribute and column are named differently."""

    __tablename__ = "test_renamed_events"
    tenant: Mapped[str | None] = mapped_column("tenant_name", String(40))


@pytest.fixture
def accounts(database_url: str, make_app: Callable[[str], Outbox]) -> Iterator[Outbox]:
    app = make_app(database_url)
    Base.metadata.create_all(app.engine)
    try:
        yield app
    finally:
        Base.metadata.drop_all(app.engine)


def _write(engine: Engine, accounts: list[str | None]) -> None:
    with engine.begin() as conn:
        conn.execute(insert(AccountEvent), [{"account": a} for a in accounts])


def _keyed(app: Outbox, batch_size: int = 10) -> list[list[str | None]]:
    groups: list[list[str | None]] = []

    @app.handler(AccountEvent, name="per_account", batch_size=batch_size, group_by="account")
    def per_account(batch: Batch[AccountEvent]) -> None:
        groups.append([event.account for event in batch.events])

    return groups


def test_each_group_holds_the_events_of_one_key(accounts: Outbox) -> None:
    app = accounts
    groups = _keyed(app, batch_size=4)
    _write(app.engine, ["a", "b", "c"] * 5 + [None, None])
    drain(app)
    expected = [("", 2), ("a", 1), ("a", 4), ("b", 1), ("b", 4), ("c", 1), ("c", 4)]
    assert (True, expected) == (
        all(len(set(group)) == 1 for group in groups),
        sorted((group[0] or "", len(group)) for group in groups),
    )


def test_claims_take_the_keys_in_turn(accounts: Outbox) -> None:
    """Account a's backlog of 50 was written first; b, c and the events with no account
    still have their turn within the first four claims."""
    app = accounts
    _keyed(app)
    _write(app.engine, ["a"] * 50 + ["b"] * 3 + ["c"] * 3 + [None] * 2)
    handler = app.get_handler("per_account")
    claimed = []
    for _ in range(8):
        claim = claimer.run_once(app, handler)
        assert claim is not None
        claimed.append(claim.size)
    assert [10, 3, 3, 2, 10, 10, 10, 10] == claimed


def test_group_by_must_name_an_events_own_column() -> None:
    app = Outbox("sqlite://")
    for column in ("nope", "group_id"):
        with pytest.raises(ConfigurationError, match="group_by must name a column"):
            app.handler(ActivityEvent, name=f"by_{column}", group_by=column)(lambda batch: None)


def test_keys_may_be_named_by_attribute_or_by_column(accounts: Outbox) -> None:
    """``tenant = mapped_column("tenant_name")``: the attribute's name and the column's both
    name the key, for keyed groups, ordered keys and per-key limits alike."""
    app = accounts
    groups: list[list[str | None]] = []

    @app.handler(
        RenamedEvent,
        batch_size=10,
        group_by="tenant",
        ordering_key="tenant_name",
        rate_limit=RateLimit(calls_per_second=1000),
        rate_limit_key="tenant",
    )
    def per_tenant(batch: Batch[RenamedEvent]) -> None:
        groups.append([event.tenant for event in batch.events])

    with app.engine.begin() as conn:
        rows = [{"tenant_name": t} for t in ["a", "b"] * 3]
        conn.execute(insert(RenamedEvent.__table__), rows)
    drain(app)
    handler = app.get_handler("per_tenant")
    keys = (handler.group_by, handler.ordering_key, handler.rate_limit_key)
    assert (["tenant_name"] * 3, [["a"] * 3, ["b"] * 3]) == (list(keys), sorted(groups))


def test_events_with_no_ordering_key_are_not_ordered_nor_held(accounts: Outbox) -> None:
    """A NULL ordering key is no key. While the first event without a key waits for its retry,
    the second is delivered; while the first of key ``a`` does, the second of ``a`` waits.
    Dead, the first without a key holds nothing; the first of ``a`` holds ``a``."""
    app = accounts
    delivered: list[int] = []
    policy = RetryPolicy(max_attempts=2, scale=0.0, base_delay=3600.0, jitter=0.0)

    @app.handler(AccountEvent, batch_size=1, retry=policy, ordering_key="account")
    def ordered(batch: Batch[AccountEvent]) -> None:
        if batch.ids[0] in failing:
            raise RuntimeError("refused")
        delivered.extend(batch.ids)

    _write(app.engine, [None, None, "a", "a"])
    with app.engine.connect() as conn:
        ids = list(conn.execute(select(AccountEvent.id).order_by(AccountEvent.id)).scalars())
    failing = {ids[0], ids[2]}
    drain(app)  # the first of each waits an hour for its second attempt
    while_retrying = list(delivered)
    with app.engine.begin() as conn:
        conn.execute(update(schema.jobs).values(run_at=db_now_plus(-1)))
    drain(app)  # their second attempt fails: dead
    with app.engine.connect() as conn:
        waiting = list(conn.execute(select(AccountEvent.id)).scalars())
    assert ([ids[1]], [ids[1]], [ids[3]], ["a"]) == (
        while_retrying,
        delivered,
        waiting,
        [key.key for key in holds.held_keys(app)],
    )


def test_one_claim_job_goes_on_to_the_next_keys(accounts: Outbox) -> None:
    """A claim job whose key is done goes on claiming while other keys' events wait: one
    distribution and one acquisition handle every key."""
    app = accounts
    groups: list[list[str | None]] = []

    @app.handler(AccountEvent, name="per_account", max_batches=1, group_by="account")
    def per_account(batch: Batch[AccountEvent]) -> None:
        groups.append([event.account for event in batch.events])

    _write(app.engine, ["a", "b", "c"] * 3)
    distributor.run_once(app)
    Worker(app, concurrency=1).run_once()
    assert [["a"] * 3, ["b"] * 3, ["c"] * 3] == groups
