"""The inbox (``Outbox.inbox``): a message id recorded in the transaction of its effect, so that
a message delivered again has no second effect; ids compared exactly, kept for the horizon and
pruned after it. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Connection, create_engine, func, select, update
from sqlalchemy.orm import Session

from outbox import ConfigurationError, Outbox, RetryPolicy, Settings, schema
from outbox._services.retention import Retention
from outbox.inbox import DEFAULT_HORIZON, kept_id
from outbox.ops import archive, ingest
from tests.conftest import reset_schema
from tests.models import EmailEvent


def _kept(conn: Connection, inbox: str) -> int:
    return int(
        conn.execute(
            select(func.count()).select_from(schema.inbox).where(schema.inbox.c.inbox == inbox)
        ).scalar_one()
    )


def test_an_id_is_new_once_and_kept_only_when_its_transaction_commits(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    orders = app.inbox("orders")
    with Session(app.engine) as session, session.begin():
        assert orders.receive(session, "m-1")
        assert not orders.receive(session, "m-1")  # the same transaction sees its own id
    with Session(app.engine) as session:
        with session.begin():
            assert not orders.receive(session, "m-1")
        with session.begin():
            assert orders.receive(session, "m-2")
            session.rollback()
    with app.engine.begin() as conn:  # a Connection does as a Session does
        assert orders.receive(conn, "m-2")
        assert orders.holds(conn, "m-1")
        assert not orders.holds(conn, "m-3")
    # Another inbox keeps its own ids.
    with app.engine.begin() as conn:
        assert app.inbox("refunds").receive(conn, "m-1")
        assert 2 == _kept(conn, "orders")


def test_ids_are_compared_exactly_and_long_ones_by_their_digest(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """MariaDB's text collations take "A1" for "a1" and "x " for "x": a message never
    received would be dropped as a repeat. Ids longer than the column are kept as digests."""
    app = make_app(database_url)
    orders = app.inbox("orders")
    long_a, long_b = "x" * 600 + "a", "x" * 600 + "b"
    given = ["A1", "a1", "x", "x ", "é", "e", long_a, long_b]
    with app.engine.begin() as conn:
        assert [True] * 8 == orders.receive_many(conn, given)
    with app.engine.begin() as conn:
        assert [False] * 16 == orders.receive_many(conn, [*given, *given])
        assert [False, True, False] == orders.receive_many(conn, ["a1", "a2", long_a])
        # Inboxes' names are compared exactly too: each keeps its own "m-1".
        for name in ("Orders", "orders ", "ORDERS"):
            assert app.inbox(name).receive(conn, "a1")
    assert kept_id("orders", long_a).startswith("sha256:")
    assert long_a == kept_id("orders", long_a[:400]) + long_a[400:]  # kept as is up to 400


def test_a_batch_of_thousands_is_recorded_by_chunks(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    orders = app.inbox("orders")
    first = [f"m-{n}" for n in range(1200)]
    with app.engine.begin() as conn:
        assert [True] * 1200 == orders.receive_many(conn, first)
    second = [f"m-{n}" for n in range(1000, 2500)]
    with app.engine.begin() as conn:
        assert [n >= 1200 for n in range(1000, 2500)] == orders.receive_many(conn, second)
        assert 2500 == _kept(conn, "orders")


def test_an_id_twice_in_a_batch_is_new_once_in_its_first_place(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A sink's re-send can land in the same batch as its first send: only the first place of
    a new id has the effect."""
    app = make_app(database_url)
    orders = app.inbox("orders")
    with app.engine.begin() as conn:
        assert [True, True, False, False] == orders.receive_many(conn, ["m-1", "m-2", "m-1", "m-2"])
        assert [False, True, False] == orders.receive_many(conn, ["m-1", "m-3", "m-3"])


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_concurrent_receiver_of_the_same_id_waits_for_the_first(
    database_url: str, make_app: Callable[..., Outbox], first_commits: bool
) -> None:
    """Two consumers handed the same message at once: the second waits for the first's
    transaction, and has the effect only when the first rolled back."""
    app = make_app(database_url)
    orders = app.inbox("orders")
    answers: list[bool] = []
    started = threading.Event()

    def second() -> None:
        with Session(app.engine) as session, session.begin():
            started.set()
            answers.append(orders.receive(session, "m-1"))

    with Session(app.engine) as session:
        session.begin()
        assert orders.receive(session, "m-1")
        thread = threading.Thread(target=second)
        thread.start()
        started.wait(10)
        time.sleep(0.3)
        assert [] == answers  # waiting for the first transaction
        session.commit() if first_commits else session.rollback()
    thread.join(30)
    assert [not first_commits] == answers


def test_ids_past_their_horizon_are_pruned_by_the_retention_pass_and_by_prune(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    short, long = app.inbox("short", horizon=0.2), app.inbox("long")
    with app.engine.begin() as conn:
        short.receive_many(conn, ["a", "b"])
        long.receive_many(conn, ["a", "b"])
    time.sleep(0.5)
    done = Retention(app).run_once()
    assert 2 == done.inbox_ids
    with app.engine.begin() as conn:
        assert (0, 2) == (_kept(conn, "short"), _kept(conn, "long"))
        assert short.receive(conn, "a")  # pruned: received again, it has its effect again
        conn.execute(update(schema.inbox).values(expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)))
    archive.prune(app, older_than=3600)
    with app.engine.begin() as conn:
        assert 0 == _kept(conn, "long")


def test_the_horizon_is_seven_days_unless_given(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    with app.engine.begin() as conn:
        app.inbox("orders").receive(conn, "m-1")
        app.inbox("hour", horizon=dt.timedelta(hours=1)).receive(conn, "m-1")
        rows = conn.execute(
            select(schema.inbox.c.inbox, schema.inbox.c.received_at, schema.inbox.c.expires_at)
        ).all()
    kept = {name: expires - received for name, received, expires in rows}
    assert DEFAULT_HORIZON == dt.timedelta(days=7)
    assert abs(kept["orders"] - DEFAULT_HORIZON) < dt.timedelta(seconds=1)
    assert abs(kept["hour"] - dt.timedelta(hours=1)) < dt.timedelta(seconds=1)


def test_bad_input_is_refused_in_one_line_naming_it(sqlite_url: str) -> None:
    reset_schema(sqlite_url)
    app = Outbox(sqlite_url)
    orders = app.inbox("orders")
    with pytest.raises(ConfigurationError, match="an inbox named 'orders' is already declared"):
        app.inbox("orders")
    too_long = (dt.timedelta.max, dt.timedelta(days=36501), 1e12)
    for horizon in (0, -1, float("nan"), float("inf"), True, "7d", dt.timedelta(0), *too_long):
        with pytest.raises(ConfigurationError, match="'bad': horizon must be a timedelta or sec"):
            app.inbox("bad", horizon=horizon)  # type: ignore[arg-type]
    for name in ("", "x" * 201, None):
        with pytest.raises(ConfigurationError, match="inbox name: expected text"):
            app.inbox(name)  # type: ignore[arg-type]
    with app.engine.begin() as conn:
        for message_id in (None, b"m-1", "", 42):
            with pytest.raises(TypeError, match="inbox 'orders': a message id is non-empty text"):
                orders.receive(conn, message_id)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="receive takes a Session or a Connection"):
        orders.receive(app.engine, "m-1")  # type: ignore[arg-type]
    # A connection that commits each statement alone would keep the id without the effect.
    autocommit = create_engine(sqlite_url, isolation_level="AUTOCOMMIT")
    for conn in (
        autocommit.connect(),
        app.engine.connect().execution_options(isolation_level="AUTOCOMMIT"),
    ):
        with conn, pytest.raises(TypeError, match="commits each statement by itself"):
            orders.receive(conn, "m-1")
    autocommit.dispose()
    with app.engine.connect() as conn:
        assert not orders.holds(conn, "m-1")
    app.engine.dispose()


def test_a_horizon_shorter_than_the_senders_resends_is_refused(sqlite_url: str) -> None:
    """Where the sender is an outbox handler, a message may be sent again up to its re-send
    horizon after it was first sent: an inbox that forgot it by then would have its effect
    twice. The horizon counts every wait, not the last alone."""
    app = Outbox(sqlite_url, settings=Settings(lease_seconds=60))
    retry = RetryPolicy(max_attempts=5, scale=10.0, exponent=1.0, base_delay=0.0, jitter=0.0)

    @app.handler(EmailEvent, retry=retry)
    def send(batch: object) -> None: ...

    horizon = app.resend_horizon("send")
    # The first send's lease, then every wait (10, 20, 30, 40 s): the sends between may all
    # have failed before they reached the downstream.
    assert 60 + 10 + 20 + 30 + 40 == horizon
    with pytest.raises(ConfigurationError, match=r"again up to 160 s .* at least 160 s"):
        app.inbox("emails", horizon=159, sender="send")
    assert app.inbox("emails", horizon=160, sender=app.handlers["send"]).horizon == 160
    with pytest.raises(ConfigurationError, match="unknown handler 'other'"):
        app.inbox("others", sender="other")


def test_the_ingests_keys_past_their_horizon_are_forgotten_by_the_retention_pass(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The HTTP API's ingest is an inbox for its producers: a key is kept for
    ``Settings.ingest_key_horizon`` (seven days unless set), then a retry writes again."""
    app = make_app(database_url, Settings(ingest_key_horizon=0.3))

    @app.handler(EmailEvent)
    def send(batch: object) -> None: ...

    assert DEFAULT_HORIZON.total_seconds() == Settings().ingest_key_horizon
    [first] = ingest.ingest(app, "send", [("k-1", {"address": "a@example.com"})])
    [again] = ingest.ingest(app, "send", [("k-1", {"address": "a@example.com"})])
    assert (True, False, first.event_id) == (first.created, again.created, again.event_id)
    assert 0 == Retention(app).run_once().ingest_keys  # not past its horizon yet
    time.sleep(0.5)
    assert 1 == Retention(app).run_once().ingest_keys
    [later] = ingest.ingest(app, "send", [("k-1", {"address": "a@example.com"})])
    assert (True, True) == (later.created, later.event_id != first.event_id)
    for horizon in (0, 1e12):
        with pytest.raises(ConfigurationError, match=r"Settings\.ingest_key_horizon must be sec"):
            Settings(ingest_key_horizon=horizon)
    app.with_settings(ingest_key_horizon=None)
    time.sleep(0.5)
    assert 0 == Retention(app).run_once().ingest_keys  # None: kept until outbox prune


def test_the_retention_pass_goes_on_where_the_inbox_table_is_not_there(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A database taken back below migration 0011 has no ``outbox_inbox``: the pass still
    forgets the ingest's keys and says it deleted no inbox id."""
    app = make_app(database_url)
    schema.inbox.drop(app.engine)
    done = Retention(app).run_once()
    assert (True, 0) == (done.ran, done.inbox_ids)
