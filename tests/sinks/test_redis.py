"""The Redis Streams sink against real Redis servers: a refused XADD retries only its own
events, a server stopped mid-drain loses nothing and opens then closes the circuit breaker,
bad configuration stops the worker with one line, no message shows the password, and each
group is one round trip."""

from __future__ import annotations

import asyncio
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from outbox import (
    Batch,
    CircuitBreaker,
    ConfigurationError,
    DownstreamError,
    DownstreamUnavailableError,
    Outbox,
    RetryPolicy,
    Settings,
)
from outbox.ops import metrics
from outbox.sinks.redis import AsyncRedisStreamSink, RedisStreamSink
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import reset_schema
from tests.models import SinkEvent
from tests.sinks._contract import (
    ACCOUNTS,
    PATIENT,
    SECRET,
    Running,
    archived,
    closed_port,
    commit_events,
    event_id,
    event_rows,
    waiting_rows,
)
from tests.sinks.kinds.redis import (
    RedisDownstream,
    RedisServer,
    make_sink,
    read_stored,
    redis_url,
)

NO_WAIT = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)
HANDLER = "to_redis"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of the test's own, started; killed after the test."""
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of the test's own whose password is ``SECRET``."""
    with RedisServer(tmp_path, password=SECRET) as server:
        yield server


@pytest.fixture
def other_key() -> Iterator[str]:
    """A key of the shared Redis that holds a string, not a stream; deleted after the test."""
    name = f"outbox-test-string-{uuid.uuid4().hex}"
    with redis.Redis.from_url(redis_url()) as client:
        client.set(name, "not a stream")
    try:
        yield name
    finally:
        with redis.Redis.from_url(redis_url()) as client:
            client.delete(name)


def _sink_class(sync: bool) -> type[RedisStreamSink] | type[AsyncRedisStreamSink]:
    return RedisStreamSink if sync else AsyncRedisStreamSink


def _status(app: Outbox) -> metrics.HandlerStatus:
    (status,) = metrics.collect(app, [HANDLER])
    return status


def _batch(engine: Engine, ids: Sequence[int], handler: str = HANDLER) -> Batch[SinkEvent]:
    """A group of the committed events ``ids``, handed over as events."""
    with Session(engine) as session:
        query = select(SinkEvent).where(SinkEvent.id.in_(ids)).order_by(SinkEvent.id)
        events = list(session.scalars(query))
    return Batch(events, group_id=uuid.uuid4(), attempt=1, handler=handler)


def _one_line_error(run: Callable[[], object]) -> Exception:
    """What ``run`` raised, checked to be one line that does not show the password."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - each caller checks the type
        run()
    message = str(raised.value)
    assert "\n" not in message
    assert SECRET not in message
    assert SECRET not in "".join(traceback.format_exception(raised.value))  # nor its causes
    return raised.value


def test_a_refused_xadd_retries_only_its_events_and_the_rest_are_done_once(
    redis_downstream: RedisDownstream,
    other_key: str,
    sync: bool,
    database_url: str,
    make_app: Callable[..., Outbox],
) -> None:
    """Events whose stream is a key of another type are refused (WRONGTYPE), retried and
    dead; the others of their groups are stored once each and done."""
    app = make_app(database_url, Settings(poll_interval=0.05))
    sink = _sink_class(sync)(
        redis_url(),
        stream=lambda e: other_key if e.account == "globex" else redis_downstream.name,
    )
    app.handler(SinkEvent, name=HANDLER, batch_size=40, archive=True, retry=NO_WAIT)(sink)
    ids = commit_events(app.engine, event_rows(100))
    refused = {i for n, i in enumerate(ids) if ACCOUNTS[n % len(ACCOUNTS)] == "globex"}

    assert Worker(app, burst=True).run()

    stored = sorted(event_id(m.message_id) for m in redis_downstream.stored())
    assert sorted(set(ids) - refused) == stored
    outcomes = archived(app.engine)
    expected = {i: "dead" if i in refused else "succeeded" for i in ids}
    assert expected == {i: status for i, (status, _) in outcomes.items()}
    assert all("WRONGTYPE" in (outcomes[i][1] or "") for i in refused)


def test_a_redis_stopped_mid_drain_loses_nothing_and_its_breaker_opens_then_closes(
    private_redis: RedisServer,
    sync: bool,
    postgres_database: str,
    make_app: Callable[..., Outbox],
) -> None:
    """Redis stopped while groups are sent and started again: every committed event is in the
    stream (at least once), none is done that the server did not store, and the breaker opens
    while it is down and closes after."""
    stream = f"orders-{uuid.uuid4().hex}"
    app = make_app(postgres_database, Settings(poll_interval=0.05))
    app.handler(
        SinkEvent,
        name=HANDLER,
        batch_size=50,
        archive=True,
        retry=PATIENT,
        circuit_breaker=CircuitBreaker(failures=2, probe_after=1, max_probe_after=2),
    )(make_sink(stream, sync=sync, url=private_redis.url))
    committed = commit_events(app.engine, event_rows(500))
    with Running(app):
        with private_redis.client() as client:
            wait_for(lambda: client.xlen(stream) > 0, "the first messages")
        private_redis.stop()
        done_while_up = set(archived(app.engine))
        committed += commit_events(app.engine, event_rows(200, start=500))
        wait_for(lambda: _status(app).breaker == "open", "the breaker to open")
        private_redis.start()
        wait_for(
            lambda: (s := _status(app)).breaker == "closed" and s.unclaimed + s.claimed == 0,
            "everything sent and the breaker closed",
            timeout=60,
        )

    stored = {event_id(m.message_id) for m in read_stored(stream, private_redis.url)}
    outcomes = archived(app.engine)
    assert [] == sorted(set(committed) - stored)
    assert [] == sorted(done_while_up - stored)
    assert {"succeeded"} == {status for status, _ in outcomes.values()}
    assert sorted(committed) == sorted(outcomes)


def _wrong_password(server: RedisServer) -> dict[str, Any]:
    return {"url": f"redis://:{SECRET}-old@127.0.0.1:{server.port}/0", "stream": "s"}


def _unreachable(server: RedisServer) -> dict[str, Any]:
    return {"url": f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0", "stream": "s"}


def _not_a_stream(server: RedisServer) -> dict[str, Any]:
    with server.client() as client:
        client.hset("accounts", "acme", "1")
    return {"url": server.url, "stream": "accounts"}


def _missing_stream(server: RedisServer) -> dict[str, Any]:
    return {"url": server.url, "stream": "absent", "create_stream": False}


@pytest.mark.parametrize(
    ("configure", "error", "words"),
    [
        (_wrong_password, DownstreamUnavailableError, "invalid username-password pair"),
        (_unreachable, DownstreamUnavailableError, "Error 111 connecting to"),
        (_not_a_stream, ConfigurationError, "'accounts' holds a hash, not a stream"),
        (_missing_stream, ConfigurationError, "'absent' does not exist and create_stream=False"),
    ],
    ids=["wrong-password", "unreachable", "not-a-stream", "missing-stream"],
)
def test_bad_configuration_stops_the_worker_at_start_with_one_line(
    locked_redis: RedisServer,
    sync: bool,
    sqlite_url: str,
    make_app: Callable[..., Outbox],
    configure: Callable[[RedisServer], dict[str, Any]],
    error: type[Exception],
    words: str,
) -> None:
    """A wrong password, an unreachable server, a stream name held by another type or a
    missing stream under ``create_stream=False``: the worker does not start, and says why in
    one line that names the handler and not the password."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(SinkEvent, name=HANDLER)(_sink_class(sync)(**configure(locked_redis)))
    commit_events(app.engine, event_rows(3))

    raised = _one_line_error(Worker(app, burst=True).run)

    assert type(raised) is error
    assert words in str(raised)
    assert f"handler {HANDLER!r}" in str(raised)


def test_a_failed_send_does_not_show_the_password(
    locked_redis: RedisServer, sync: bool, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A pipeline cut off by a stopped server fails the group with one line and no password."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    sink = _sink_class(sync)(locked_redis.url, stream="orders")
    app.handler(SinkEvent, name=HANDLER)(sink)
    batch = _batch(app.engine, commit_events(app.engine, event_rows(5)))
    handler = app.get_handler(HANDLER)
    face = sink if isinstance(sink, RedisStreamSink) else sink.blocking()
    face.outbox_start(app, handler)
    locked_redis.stop()

    raised = _one_line_error(lambda: face(batch))

    face.outbox_stop()
    assert type(raised) is DownstreamError
    assert "Redis at redis://127.0.0.1:" in str(raised)


def test_the_downstream_names_the_server_without_its_password() -> None:
    """The sink's downstream is the URL less its password and its query."""
    sink = RedisStreamSink(f"redis://app:{SECRET}@cache.internal:6380/2?password=x", stream="s")

    assert "Redis at redis://app@cache.internal:6380/2" == sink.downstream


class _RoundTrips:
    """Round trips a counting connection made: a write after a read (or the first write)
    starts one."""

    count: ClassVar[int] = 0


class _CountingConnection(redis.connection.Connection):
    _awaiting = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._awaiting:
            _RoundTrips.count += 1
            self._awaiting = True
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._awaiting = False
        return super().read_response(*args, **kwargs)


class _AsyncCountingConnection(redis.asyncio.connection.Connection):
    _awaiting = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._awaiting:
            _RoundTrips.count += 1
            self._awaiting = True
        await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._awaiting = False
        return await super().read_response(*args, **kwargs)


def _round_trips_per_group(
    sink: RedisStreamSink | AsyncRedisStreamSink, app: Outbox, batches: list[Batch[SinkEvent]]
) -> list[int]:
    """Start ``sink`` as a worker would, send each batch, and count each one's round trips."""
    handler = app.get_handler(HANDLER)
    if isinstance(sink, RedisStreamSink):
        sink.outbox_start(app, handler)
        trips = []
        for batch in batches:
            before = _RoundTrips.count
            sink(batch)
            trips.append(_RoundTrips.count - before)
        sink.outbox_stop()
        return trips

    async def run() -> list[int]:
        await sink.outbox_start(app, handler)
        trips = []
        for batch in batches:
            before = _RoundTrips.count
            await sink(batch)
            trips.append(_RoundTrips.count - before)
        await sink.outbox_stop()
        return trips

    return asyncio.run(run())


def test_each_group_is_one_round_trip(
    private_redis: RedisServer, sync: bool, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Groups of 1, 40 and 500 events: one write and its replies each, one XADD per event
    (counted on a real connection and by the server)."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    if sync:
        pool: Any = redis.ConnectionPool(
            connection_class=_CountingConnection, port=private_redis.port
        )
        client: Any = redis.Redis(connection_pool=pool)
    else:
        pool = redis.asyncio.ConnectionPool(
            connection_class=_AsyncCountingConnection, port=private_redis.port
        )
        client = redis.asyncio.Redis(connection_pool=pool)
    sink = _sink_class(sync)(private_redis.url, stream="orders", client=client)
    app.handler(SinkEvent, name=HANDLER, ordering_key="account")(sink)
    ids = commit_events(app.engine, event_rows(541))
    batches = [_batch(app.engine, part) for part in (ids[:1], ids[1:41], ids[41:])]
    xadds_before = private_redis.xadd_calls()

    trips = _round_trips_per_group(sink, app, batches)

    assert [1, 1, 1] == trips
    assert 541 == private_redis.xadd_calls() - xadds_before
    assert sorted(ids) == sorted(
        event_id(m.message_id) for m in read_stored("orders", private_redis.url)
    )
    if sync:
        client.close()


def test_maxlen_trims_the_stream_and_no_ordering_key_means_no_key_field(
    redis_downstream: RedisDownstream, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """``maxlen`` with ``approximate=False`` keeps exactly the latest messages; a handler
    without an ordering key sends no ``key`` field."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    sink = RedisStreamSink(redis_url(), stream=redis_downstream.name, maxlen=10, approximate=False)
    app.handler(SinkEvent, name=HANDLER, batch_size=25)(sink)
    ids = commit_events(app.engine, event_rows(60))

    # One group at a time: without an ordering key, groups sent at once may end in any order.
    assert Worker(app, burst=True, concurrency=1).run()

    stored = redis_downstream.stored()
    assert ids[-10:] == [event_id(m.message_id) for m in stored]
    assert {None} == {m.key for m in stored}


def test_a_group_read_from_its_rows_sends_the_messages_its_events_would(
    private_redis: RedisServer, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The default messages of a group handed over as rows (as a worker does) are, byte for
    byte, those of the same group handed over as events."""
    reset_schema(sqlite_url)
    sinks = {
        stream: RedisStreamSink(private_redis.url, stream=stream) for stream in ("rows", "events")
    }
    for stream, sink in sinks.items():
        app = make_app(sqlite_url)
        app.handler(SinkEvent, name=stream, ordering_key="account")(sink)
        sink.outbox_start(app, app.get_handler(stream))
    ids = commit_events(app.engine, event_rows(30))
    rows = waiting_rows(app.engine)
    group = uuid.uuid4()

    sinks["rows"](Batch(rows=rows, model=SinkEvent, group_id=group, attempt=1, handler="rows"))
    sinks["events"](_batch(app.engine, ids, handler="events"))

    with private_redis.client() as client:
        stored = {s: [f for _, f in client.xrange(s)] for s in sinks}
    for sink in sinks.values():
        sink.outbox_stop()
    assert 30 == len(stored["events"])
    assert stored["events"] == stored["rows"]
