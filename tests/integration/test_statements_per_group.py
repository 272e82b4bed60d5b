"""The statements a drain sends per group, counted exactly, so that no change adds one unseen.

Every statement the app's engine sends is counted (``before_cursor_execute``), and so are the
transactions it begins, commits and rolls back (``begin``, ``commit``, ``rollback``: the BEGIN
and COMMIT the driver sends). A drain of ``FEW`` groups and one of ``MANY`` run after a
warm-up drain, on the same tables, so that what every drain pays once (distribution, the
acquisition of the claim job, the claim that finds the buffer empty, rescue, the throughput
record at its end) is the same in both: the difference, divided by the difference in groups,
is what one group costs. The handler keeps one claim job (``max_batches=1``), so that
distribution inserts the same one slot whatever the backlog. The drains are far shorter than a
claim job's loop (``CLAIM_LOOP_SECONDS``) and the refresh of pauses and breakers: what comes
once a second or more does not fall within them.

The figures are today's; a change that makes a group cheaper lowers them here, one that adds
a statement per group fails. The same account on a real fleet, from ``pg_stat_statements``:
``python -m benchmarks.statement_account`` (benchmarks/RESULTS.md, "Statements per group").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from outbox import Batch, CircuitBreaker, Outbox, RateLimit, add_events
from outbox._db.queries import limits
from outbox._engine import limiter
from outbox.ops import flow
from outbox.testing import drain
from tests.conftest import reset_schema
from tests.models import ActivityEvent

BATCH = 10
FEW, MANY = 2, 6  # groups in the two measured drains

# Per group on PostgreSQL: the finish (the group's rows and its job deleted: one statement)
# and the next claim (its rows, its batch job leased to the worker, whether more wait: one
# statement) in one transaction: BEGIN, finish, claim, COMMIT. The raw loop
# (benchmarks/_raw_drain.py) sends six: its claim and its delete each in a transaction.
POSTGRESQL_PER_GROUP = 4
# Per group on SQLite, the finish and the next claim in one transaction: BEGIN IMMEDIATE
# (counted twice: SQLAlchemy's begin and the statement it sends); DELETE the group's job and
# its rows; the claim job's lease pushed back (the next claim's fence); the rows' UPDATE ...
# RETURNING; the batch job's INSERT; are more rows unclaimed?; COMMIT.
SQLITE_PER_GROUP = 9
# Per group on MariaDB, the finish and the next claim in one transaction: its begin (no
# statement of its own); DELETE the group's job and its rows; the claim job's lease pushed
# back; the rows picked whole FOR UPDATE SKIP LOCKED and stamped by id; the batch job's INSERT;
# are more rows unclaimed?; COMMIT. The raw loop sends six: SELECT ids, UPDATE, SELECT rows,
# COMMIT, DELETE, COMMIT.
MARIADB_PER_GROUP = 9
PER_GROUP = {
    "postgresql": POSTGRESQL_PER_GROUP,
    "sqlite": SQLITE_PER_GROUP,
    "mysql": MARIADB_PER_GROUP,
}

# What a rate limit adds per group: its turn is reserved in the database, one transaction per
# call (the limit's state is the fleet's, shared in ``outbox_rate_limits``): BEGIN; lock its
# rows and read their windows and the clock (one statement; the rows made only by a limit's
# first reservation); one UPDATE of every row (two here: the rate and its burst spacing);
# COMMIT. Before: the rows inserted again on every call (on SQLite an INSERT per row), locked,
# then read, and one UPDATE per row: 7 on PostgreSQL, 9 on SQLite.
RATE_LIMIT_PER_GROUP = {"postgresql": 4, "sqlite": 5, "mysql": 4}
# What a circuit breaker adds per group that succeeds while it is closed with no failure
# counted: nothing. Its count is reset only where the worker's view of the breakers (read every
# second, and every failure it counted since) says there may be one. Before: its count read in
# a transaction of its own after every group (BEGIN, SELECT, COMMIT: 3; on SQLite 4).
BREAKER_PER_GROUP = {"postgresql": 0, "sqlite": 0, "mysql": 0}
# A handler with a fleet-wide concurrency cap, per group, in all: its claim leases the group
# to its worker with its rows, as a plain claim does, and keeps the claim job; then the
# handler's groups in flight are counted under its lock (one transaction: BEGIN, the lock,
# the count, COMMIT; on SQLite the count alone, the transaction holding the write lock), and
# the group is finished. 10 where a plain group costs 6; on SQLite 16 where it costs 12.
# Before: 25 and 30 (the claim job given back after every claim, two capped acquisitions per
# group, its rows loaded a second time).
CONCURRENCY_CAP_PER_GROUP = {"postgresql": 10, "sqlite": 16, "mysql": 14}


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def dialect(request: pytest.FixtureRequest) -> str:
    """The database each test runs on."""
    return str(request.param)


@pytest.fixture
def url(dialect: str, request: pytest.FixtureRequest, tmp_path: object) -> str:
    """A migrated, empty database of that kind."""
    url = {
        "postgresql": lambda: request.getfixturevalue("postgres_url"),
        "mysql": lambda: request.getfixturevalue("mariadb_url"),
        "sqlite": lambda: f"sqlite:///{tmp_path}/outbox.sqlite3",
    }[dialect]()
    reset_schema(url)
    return url


def noop(batch: Batch[ActivityEvent]) -> None:
    """Accept every event."""


def flat(statement: str) -> str:
    """A statement on one line."""
    return re.sub(r"\s+", " ", statement).strip()


class Sent:
    """Statements and transaction ends an engine sends while counting."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counts: Counter[str] = Counter()

    def _statement(self, conn: Connection, cursor: Any, statement: str, *_: Any) -> None:
        self.counts[flat(statement)] += 1

    def _begin(self, conn: Connection) -> None:
        self.counts["(begin)"] += 1

    def _commit(self, conn: Connection) -> None:
        self.counts["(commit)"] += 1

    def _rollback(self, conn: Connection) -> None:
        self.counts["(rollback)"] += 1

    def _listeners(self) -> list[tuple[str, Callable[..., None]]]:
        return [
            ("before_cursor_execute", self._statement),
            ("begin", self._begin),
            ("commit", self._commit),
            ("rollback", self._rollback),
        ]

    def __enter__(self) -> Sent:
        for name, listener in self._listeners():
            event.listen(self.engine, name, listener)
        return self

    def __exit__(self, *_: object) -> None:
        for name, listener in self._listeners():
            event.remove(self.engine, name, listener)


def commit_groups(app: Outbox, groups: int) -> None:
    """Commit ``groups`` full batches of events."""
    with app.engine.begin() as conn:
        add_events(conn, ActivityEvent, [{"activity_id": n} for n in range(groups * BATCH)])


def per_group(app: Outbox, run: Callable[[int], None]) -> dict[str, float]:
    """Each statement's count per group: ``run(groups)`` commits and drains that many groups,
    after a warm-up run; what a drain of ``FEW`` and one of ``MANY`` sent, apart."""
    run(1)
    counted = []
    for groups in (FEW, MANY):
        with Sent(app.engine) as sent:
            run(groups)
        counted.append(sent.counts)
    few, many = counted
    return {
        statement: (many[statement] - few[statement]) / (MANY - FEW)
        for statement in sorted(set(few) | set(many))
        if many[statement] != few[statement]
    }


def described(found: dict[str, float]) -> str:
    """The statements per group, for a failure's message."""
    return "\n".join(f"{count:g} x {statement[:150]}" for statement, count in found.items())


@pytest.fixture
def app(url: str) -> Iterator[Outbox]:
    """An application on it, its handler registered by the test."""
    app = Outbox(url)
    yield app
    app.engine.dispose()


def plain_drain(app: Outbox) -> Callable[[int], None]:
    """Commit the groups, then drain them."""

    def run(groups: int) -> None:
        commit_groups(app, groups)
        drain(app)

    return run


def test_a_group_costs_a_finish_and_a_claim_in_one_transaction(app: Outbox, dialect: str) -> None:
    """A group of a plain handler is a finish and the next claim, in one transaction: four
    statements on PostgreSQL, where the raw loop sends six."""
    app.handler(ActivityEvent, batch_size=BATCH, max_batches=1)(noop)
    found = per_group(app, plain_drain(app))
    assert PER_GROUP[dialect] == sum(found.values()), described(found)


def test_a_pause_and_resume_costs_a_group_nothing(app: Outbox, dialect: str) -> None:
    """A handler paused while its events wait, drained (nothing handled), resumed and drained
    again: per group, the statements of a plain drain; the pause is paid once."""
    app.handler(ActivityEvent, batch_size=BATCH, max_batches=1)(noop)

    def run(groups: int) -> None:
        commit_groups(app, groups)
        flow.pause(app, "noop")
        assert 0 == drain(app).stats.groups_succeeded
        flow.resume(app, "noop")
        assert groups == drain(app).stats.groups_succeeded

    found = per_group(app, run)
    assert PER_GROUP[dialect] == sum(found.values()), described(found)


def test_a_rate_limit_costs_a_group_its_reservation_only(
    app: Outbox, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a rate limit it never meets, a group costs a plain group's statements and the
    reservation of its turn, one transaction."""
    # A worker that finds itself later than the margin after its reservation (a slow commit on
    # a busy machine) reserves again: counted here, that would be the machine's, not the code's.
    monkeypatch.setattr(limiter, "MARGIN_SECONDS", 60.0)
    # Likewise a locking read of the limit's rows slower than a few milliseconds, read again.
    monkeypatch.setattr(limits, "READ_AGAIN_AFTER_SECONDS", 60.0)
    limit = RateLimit(calls=100_000, per=1)
    app.handler(ActivityEvent, batch_size=BATCH, max_batches=1, rate_limit=limit)(noop)
    found = per_group(app, plain_drain(app))
    expected = PER_GROUP[dialect] + RATE_LIMIT_PER_GROUP[dialect]
    assert expected == sum(found.values()), described(found)


def test_a_circuit_breaker_costs_a_group_nothing(app: Outbox, dialect: str) -> None:
    """With a circuit breaker that stays closed and counts no failure, a group costs a plain
    group's statements: a success resets the count only where there is one."""
    breaker = CircuitBreaker(failures=5)
    app.handler(ActivityEvent, batch_size=BATCH, max_batches=1, circuit_breaker=breaker)(noop)
    found = per_group(app, plain_drain(app))
    expected = PER_GROUP[dialect] + BREAKER_PER_GROUP[dialect]
    assert expected == sum(found.values()), described(found)


def test_a_concurrency_cap_costs_a_group_the_count_of_its_groups_in_flight(
    app: Outbox, dialect: str
) -> None:
    """Under a fleet-wide concurrency cap, a claim leases its group to its worker with its
    rows and keeps its claim job, as without a cap; the group is handled once the handler's
    groups in flight, that one among them, are counted within the cap: a plain group's
    statements and one short transaction."""
    app.handler(ActivityEvent, batch_size=BATCH, max_batches=1, concurrency=2)(noop)
    found = per_group(app, plain_drain(app))
    assert CONCURRENCY_CAP_PER_GROUP[dialect] == sum(found.values()), described(found)
