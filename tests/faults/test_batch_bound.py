"""The batch bound: no claim stamps more than ``batch_size`` rows, whatever plan PostgreSQL picks.

The claim's connections get planner settings that force bad plans (no hash or merge joins, no
materialisation, then no TID scans, then no index or bitmap scans, then no hash aggregation or
sort), several claimers claim a large buffer at once, round after round behind a barrier, and
every claim must still take at most ``batch_size`` rows.

Why the claim is a locking CTE: under the last of those plans PostgreSQL runs an
``UPDATE ... WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`` as a nested-loop semi
join with the subquery on the inner side, re-run for every row of the buffer; each re-run skips
the rows the statement has just updated and returns the next ``n``, so the statement stamps the
whole buffer. A ``WITH`` query holding ``FOR UPDATE`` is not folded into the outer query: it is
evaluated once (a ``CTE Scan`` in the plan), and the claim's UPDATE takes the rows at the
addresses (``ctid``) it locked, gathered once into an array (an ``InitPlan``), so the claim
stays within ``n`` whether PostgreSQL reaches them by a TID scan or by a sequential scan.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, func, select, update

from outbox import Batch, Outbox
from outbox._engine import claimer
from outbox._engine.claimer import Claim
from tests.models import ActivityEvent

WAIT_SECONDS = 30.0
"""How long the claimers may take before the test fails instead of hanging."""

ROWS = 6_000
BATCH_SIZE = 100
CLAIMERS = 4
ROUNDS = 5
"""Claims per claimer: under a seq-scan plan every claim reads the whole table, so not all."""

SMALL_ROWS = 1_000
"""The IN form re-reads the buffer once per row: quadratic, so it is shown on a smaller one."""

NO_JOINS = ("enable_hashjoin", "enable_mergejoin", "enable_material")
NO_INDEX = ("enable_indexscan",)
NO_BITMAP = ("enable_bitmapscan",)
NO_UNIQUE = ("enable_hashagg", "enable_sort")
"""No way to de-duplicate a subquery's rows: the planner re-runs an IN subquery per outer row."""

NO_TID = ("enable_tidscan",)
"""The claim's UPDATE becomes a sequential scan filtering on the array of locked addresses."""

PLANS = {
    "nested loops only": NO_JOINS,
    "no TID scans": NO_JOINS + NO_TID,
    "no index scans": NO_JOINS + NO_INDEX,
    "no index or bitmap scans": NO_JOINS + NO_INDEX + NO_BITMAP,
    "no hash aggregate or sort": NO_JOINS + NO_UNIQUE,
}
WORST_PLAN = PLANS["no hash aggregate or sort"]


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


def switch_off_on_connect(engine: Engine, settings: tuple[str, ...]) -> None:
    """Switch the planner ``settings`` off in every new connection of ``engine``."""

    @event.listens_for(engine, "connect", insert=True)
    def configure(dbapi_connection: Any, connection_record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            for name in settings:
                cursor.execute(f"SET SESSION {name} = off")
        dbapi_connection.autocommit = autocommit


def current_settings(engine: Engine, settings: tuple[str, ...]) -> dict[str, str]:
    """The values of ``settings`` in a connection of ``engine``."""
    with engine.connect() as conn:
        return {name: conn.exec_driver_sql(f"SHOW {name}").scalar_one() for name in settings}


def claiming_app(make_app: Callable[[str], Outbox], url: str, settings: tuple[str, ...]) -> Outbox:
    """An application whose every connection plans with ``settings`` switched off."""
    app = make_app(url)
    switch_off_on_connect(app.engine, settings)
    app.handler(ActivityEvent, name="sync", batch_size=BATCH_SIZE)(noop)
    return app


def group_sizes(engine: Engine) -> dict[uuid.UUID | None, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(ActivityEvent.group_id, func.count()).group_by(ActivityEvent.group_id)
        )
        return {g: int(n) for g, n in rows}


def fill_buffer(url: str, commit_events: Callable[..., list[int]], rows: int) -> Iterator[Engine]:
    """Commit ``rows`` events and analyze the buffer, so that plans are stable."""
    engine = create_engine(url)
    commit_events(engine, rows)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"ANALYZE {ActivityEvent.__tablename__}")
        conn.commit()
    yield engine
    engine.dispose()


@pytest.fixture
def large_buffer(
    postgres_database: str, commit_events: Callable[..., list[int]]
) -> Iterator[Engine]:
    """The buffer filled with ROWS committed events."""
    yield from fill_buffer(postgres_database, commit_events, ROWS)


@pytest.fixture
def small_buffer(
    postgres_database: str, commit_events: Callable[..., list[int]]
) -> Iterator[Engine]:
    """The buffer filled with SMALL_ROWS committed events."""
    yield from fill_buffer(postgres_database, commit_events, SMALL_ROWS)


@pytest.mark.parametrize("plan", list(PLANS))
def test_concurrent_claims_never_exceed_batch_size_under_a_forced_plan(
    plan: str,
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    large_buffer: Engine,
) -> None:
    """Four claimers on bad-plan connections claim together, round after round: each <= n."""
    switched_off = PLANS[plan]
    apps = [claiming_app(make_app, postgres_database, switched_off) for _ in range(CLAIMERS)]
    settings = [current_settings(app.engine, switched_off) for app in apps]
    barrier = threading.Barrier(CLAIMERS, timeout=WAIT_SECONDS)
    claims: list[Claim | None] = []
    errors: list[BaseException] = []

    def claim_rounds(app: Outbox) -> None:
        handler = app.get_handler("sync")
        try:
            for _ in range(ROUNDS):
                barrier.wait()  # every round, all claims start together
                claims.append(claimer.run_once(app, handler))
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=claim_rounds, args=(app,), daemon=True) for app in apps]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT_SECONDS
    try:
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
    finally:
        barrier.abort()
    still_running = [t.name for t in threads if t.is_alive()]
    stamped = {g: n for g, n in group_sizes(large_buffer).items() if g is not None}
    reported = {c.group_id: c.size for c in claims if c is not None}
    assert (
        [dict.fromkeys(switched_off, "off")] * CLAIMERS,
        [],
        [],
        CLAIMERS * ROUNDS,
        [],
        reported,
    ) == (
        settings,
        still_running,
        errors,
        len(reported),
        [n for n in stamped.values() if n > BATCH_SIZE],
        stamped,
    )


def sent_claims(engine: Engine, run: Callable[[], object]) -> list[tuple[str, Any]]:
    """The claim statements (text and parameters) ``run`` sends through ``engine``."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Connection, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if f"UPDATE {ActivityEvent.__tablename__}" in statement:
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    return sent


def test_claim_is_sent_as_a_locking_cte(
    make_app: Callable[[str], Outbox], postgres_database: str, small_buffer: Engine
) -> None:
    """The claim PostgreSQL receives is WITH ... FOR UPDATE SKIP LOCKED, then an UPDATE of the
    rows at the addresses the CTE locked."""
    app = claiming_app(make_app, postgres_database, WORST_PLAN)
    ((statement, _),) = sent_claims(
        app.engine, lambda: claimer.run_once(app, app.get_handler("sync"))
    )
    flat = " ".join(statement.split())
    assert (True, True, True, False) == (
        flat.startswith("WITH claimable AS (SELECT ctid"),
        "ORDER BY test_activity_events.id LIMIT" in flat and "FOR UPDATE SKIP LOCKED)" in flat,
        "UPDATE test_activity_events SET group_id=" in flat
        and "WHERE ctid = ANY (array((SELECT claimable.ctid FROM claimable)))" in flat,
        "IN (SELECT" in flat,
    )


def test_claim_pick_runs_once_as_a_cte_under_the_worst_plan(
    make_app: Callable[[str], Outbox], postgres_database: str, small_buffer: Engine
) -> None:
    """Without hash aggregate or sort, the claim's pick is still one CTE, scanned once into
    the array of addresses (an InitPlan, ``$n``) that the UPDATE's scan checks, never re-run."""
    app = claiming_app(make_app, postgres_database, WORST_PLAN)
    ((statement, parameters),) = sent_claims(
        app.engine, lambda: claimer.run_once(app, app.get_handler("sync"))
    )
    with app.engine.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).scalars())
    assert (True, True, True, True, False) == (
        "CTE claimable" in plan,
        "InitPlan" in plan,
        "CTE Scan on claimable" in plan,
        "ctid = ANY ($" in plan,
        "Semi Join" in plan,
    )


def test_in_subquery_form_claims_past_its_limit_under_the_worst_plan(
    make_app: Callable[[str], Outbox], postgres_database: str, small_buffer: Engine
) -> None:
    """Why a CTE: the natural IN (SELECT ... LIMIT n SKIP LOCKED) stamps the whole buffer."""
    app = claiming_app(make_app, postgres_database, WORST_PLAN)
    pick = (
        select(ActivityEvent.id)
        .where(ActivityEvent.group_id.is_(None))
        .order_by(ActivityEvent.id)
        .limit(BATCH_SIZE)
        .with_for_update(skip_locked=True)
    )
    natural = update(ActivityEvent).where(ActivityEvent.id.in_(pick)).values(group_id=uuid.uuid4())
    with app.engine.connect() as conn:
        stamped_by_in_form = conn.execute(natural).rowcount
        conn.rollback()  # a demonstration: nothing of it stays
    claim = claimer.run_once(app, app.get_handler("sync"))
    assert (BATCH_SIZE, SMALL_ROWS) == (claim.size if claim else 0, stamped_by_in_form)
