"""The newcomer's scenario, end to end: a bulk API that limits the whole client and each
account, answers per record ``422`` (invalid, for good) and ``429`` (an account over its
limit, with ``retry_after``), refuses a whole call with ``400`` for one poison record, and
goes down for a moment with ``503`` and ``Retry-After``; a handler written from
docs/flow-control.md (``tests/acceptance/accounts_bulk_app.py``); three ``outbox work``
processes; a writer committing good events all through the bisection of the poison records.

On PostgreSQL and MariaDB: every good event reaches the API exactly once, every invalid one is
discarded with the API's reason, every poison one is dead alone with its ``DataError``, no good
event is dead, the client's limit never answers ``429``, no account's window is over its limit,
the good events written during the bisection are delivered within their band's promise, and
the circuit breaker never opens (the poison records are the data's failures, not the API's).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import outbox
from examples.marketing_sync.fake_api import FakeMarketingAPIProcess
from outbox import add_events, schema
from outbox._core.log import BREAKER_OPENED
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance import accounts_bulk_app as bulk
from tests.acceptance._cli import LEASE, Cli

pytestmark = pytest.mark.timeout(150)

ACCOUNTS = 6
# An account on a smaller plan: the API allows it one call a second, the handler sends it
# up to ACCOUNT_CALLS; the calls over its limit come back as per-record 429s.
SMALL_PLAN = "6"
SMALL_PLAN_CALLS = 1
EVENTS = 3_000
NO_EMAIL_EVERY = 53
# In accounts 4, 5 and 3 (``_account_of``), none in the small plan's.
POISON = {418, 1_234, 2_222}
WRITE_EVERY_SECONDS = 0.2
# The writer's accounts: one with a poison record (4) and one without.
WRITER_ACCOUNTS = (1, 4)
OUTAGE_SECONDS = 1.5
# The outage starts once this many records were taken: in the middle of the drain.
OUTAGE_AFTER_RECORDS = 2_000
DRAIN_SECONDS = 90.0
WAIT_POLL_SECONDS = 0.25
REFUSED_BY_API = "a record of this call could not be read"
REFUSED = f"DataError: {bulk.REFUSED_WHOLE}: {REFUSED_BY_API}"


def _account_of(n: int) -> int:
    """A third of the events are the small plan's: more calls than its limit lets through,
    whatever the order the others' groups go in."""
    return int(SMALL_PLAN) if n % 3 == 0 else n % (ACCOUNTS - 1) + 1


def _kind(n: int) -> str:
    if n in POISON:
        return "poison"
    return "no_email" if n % NO_EMAIL_EVERY == 0 else "viewed"


class Writer(threading.Thread):
    """Commits a good event of each of WRITER_ACCOUNTS every WRITE_EVERY_SECONDS until
    stopped; records when each was committed (``time.monotonic()``, the API's clock: the same
    process)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(name="writer", daemon=True)
        self.engine = engine
        self.committed: dict[str, float] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        tick = 0
        try:
            while not self.stop.is_set():
                rows = [
                    {"ref": f"w{tick}-{account}", "account_id": account, "kind": "viewed"}
                    for account in WRITER_ACCOUNTS
                ]
                with self.engine.begin() as conn:
                    add_events(conn, bulk.AccountActivityEvent, rows)
                now = time.monotonic()
                self.committed.update((row["ref"], now) for row in rows)
                tick += 1
                self.stop.wait(WRITE_EVERY_SECONDS)
        except BaseException as error:  # reported by the test, not lost in the thread
            self.error = error


@pytest.fixture
def engine(server_database: str, connect: Callable[[str], Engine]) -> Iterator[Engine]:
    """The database, with the application's own buffer table (dropped after)."""
    yield from _with_buffer(connect(server_database))


@pytest.fixture
def postgres_engine(postgres_database: str, connect: Callable[[str], Engine]) -> Iterator[Engine]:
    """The PostgreSQL database, with the application's own buffer table (dropped after)."""
    yield from _with_buffer(connect(postgres_database))


def _with_buffer(engine: Engine) -> Iterator[Engine]:
    bulk.Base.metadata.drop_all(engine)
    bulk.Base.metadata.create_all(engine)
    yield engine
    bulk.Base.metadata.drop_all(engine)


def _archived(engine: Engine) -> list[dict[str, Any]]:
    archive = schema.archive
    with engine.connect() as conn:
        rows = conn.execute(
            select(archive.c.status, archive.c.group_id, archive.c.error, archive.c.payload)
        )
        return [dict(row._mapping) for row in rows]


def _dead(engine: Engine) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(schema.archive.c.status == "dead")
        return int(conn.execute(query).scalar_one())


def _wait(condition: Callable[[], bool], what: str) -> None:
    """``wait_for``, polling a few times a second only: the API shares this process, and a
    busy poll would delay its answers (and spread the arrivals it counts)."""
    wait_for(lambda: condition() or time.sleep(WAIT_POLL_SECONDS), what, timeout=DRAIN_SECONDS)


def _account(ref: str, initial: dict[str, tuple[int, str]]) -> str:
    """The account of an event: the initial ones' from their table, the writer's from its ref."""
    return str(initial[ref][0]) if ref in initial else ref.rsplit("-", 1)[1]


def test_a_newcomers_bulk_api_with_every_kind_of_answer(
    cli: Cli, server_database: str, engine: Engine
) -> None:
    """Every kind of answer, through the handler written from docs/flow-control.md."""
    _every_kind_of_answer(cli, server_database, engine, "hand-written")


def test_the_bulk_http_sink_with_every_kind_of_answer(
    cli: Cli, postgres_database: str, postgres_engine: Engine
) -> None:
    """Every kind of answer, through the bulk HTTP sink given the same options (the databases'
    differences are the hand-written run's and the sinks' contract's)."""
    _every_kind_of_answer(cli, postgres_database, postgres_engine, "sink")


def _every_kind_of_answer(cli: Cli, server_database: str, engine: Engine, handler: str) -> None:
    initial = {f"e{n}": (_account_of(n), _kind(n)) for n in range(EVENTS)}
    with engine.begin() as conn:
        add_events(
            conn,
            bulk.AccountActivityEvent,
            [{"ref": ref, "account_id": a, "kind": k} for ref, (a, k) in initial.items()],
        )
    api = FakeMarketingAPIProcess(
        max_records=bulk.BATCH_SIZE,
        rate_limit=bulk.API_CALLS_PER_SECOND,
        account_limit=bulk.API_ACCOUNT_CALLS_PER_SECOND,
        account_limits={SMALL_PLAN: SMALL_PLAN_CALLS},
    )
    writer = Writer(engine)
    with api:
        work = cli.start(
            "--app", f"{bulk.__name__}:app", "--database-url", server_database,
            "work", *LEASE, "--processes", "3",
            env={bulk.URL_ENV: api.url, bulk.HANDLER_ENV: handler},
        )  # fmt: skip
        writer.start()
        try:
            _wait(lambda: len(api.received) >= OUTAGE_AFTER_RECORDS, "records taken")
            api.outage(OUTAGE_SECONDS)
            _wait(lambda: _dead(engine) >= len(POISON), "the poison records")
        finally:
            writer.stop.set()
            writer.join()
        _wait(lambda: _tables.buffer_is_empty(engine, bulk.AccountActivityEvent), "the drain")
        work.send(signal.SIGTERM)
        stopped = work.wait(60)
        calls, received, rejected = api.calls, api.received, api.rejected
        most = api.most_calls_in_a_second()
        windows = {str(a): api.most_calls_in_a_second(str(a)) for a in range(1, ACCOUNTS + 1)}
        limits = {account: api.limit_of(account) for account in windows}
    assert writer.error is None
    with engine.connect() as conn:
        breaker = conn.execute(
            select(schema.handlers.c.trips, schema.handlers.c.failures).where(
                schema.handlers.c.name == "sync_accounts"
            )
        ).one()
    archived = _archived(engine)

    kinds = {ref: kind for ref, (_, kind) in initial.items()}
    kinds.update(dict.fromkeys(writer.committed, "viewed"))
    good = {ref for ref, kind in kinds.items() if kind == "viewed"}
    invalid = {ref for ref, kind in kinds.items() if kind == "no_email"}
    poison = {ref for ref, kind in kinds.items() if kind == "poison"}

    # Every good event taken once: none lost, none twice (the API counts what it took).
    assert (0, good, []) == (stopped, set(received), [r for r, n in received.items() if n > 1])

    # Discarded with the API's reason, dead alone with the DataError's message; nothing else.
    by_status: dict[str, dict[str, dict[str, Any]]] = {}
    for row in archived:
        by_status.setdefault(row["status"], {})[row["payload"]["ref"]] = row
    assert {"discarded", "dead"} == set(by_status)
    assert invalid == set(by_status["discarded"]) == set(rejected)
    assert {"missing email"} == {row["error"] for row in by_status["discarded"].values()}
    dead = by_status["dead"]
    groups = Counter(row["group_id"] for row in archived)
    assert poison == set(dead)
    sent_to = f"{api.url}{bulk.BULK_PATH}"
    refused = REFUSED if handler == "hand-written" else f"DataError: 400 Bad Request from {sent_to}"
    assert {True} == {row["error"].startswith(refused) for row in dead.values()}
    assert {True} == {REFUSED_BY_API in row["error"].splitlines()[0] for row in dead.values()}
    assert [1] * len(POISON) == [groups[row["group_id"]] for row in dead.values()]

    # The client's limit never answered 429, nor did any second see more calls arrive than
    # it; the outage answered 503 and was waited out.
    statuses = Counter(call.status for call in calls)
    assert (0, True, True) == (statuses[429], statuses[503] > 0, statuses[400] > 0), statuses
    assert most <= bulk.API_CALLS_PER_SECOND, most

    # At the API, no account had more calls taken in a second than its limit; the calls over
    # it were answered 429 per record (the small plan's only), and those records delivered
    # later.
    throttled = {ref: call.at for call in calls for ref in call.throttled}
    taken_at = {ref: call.at for call in calls for ref in call.taken}
    assert all(windows[a] <= (limits[a] or 0) for a in windows), (windows, limits)
    assert (True, {SMALL_PLAN}) == (
        set(throttled) <= good | invalid,
        {_account(ref, initial) for ref in throttled},
    )
    assert [] == [ref for ref, at in throttled.items() if ref in good and taken_at[ref] <= at]

    # Good events committed while bisection isolated the poison records: within MINUTES.
    refused_at = [call.at for call in calls if call.status == 400]
    during = {
        ref: taken_at[ref] - at
        for ref, at in writer.committed.items()
        if min(refused_at) <= at <= max(refused_at)
    }
    assert during, (min(refused_at), max(refused_at))
    assert max(during.values()) <= outbox.Urgency.MINUTES.promise, max(during.values())

    # The breaker never opened: a poison record is the data's failure, a 503 a deferral.
    stderr = work.stderr()
    assert (0, 0, False) == (breaker.trips, breaker.failures, BREAKER_OPENED in stderr)
