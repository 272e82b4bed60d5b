"""The RabbitMQ sink on the shared broker, sync and async: an unroutable message is an error,
never a silent drop; what the broker did not confirm, and only that, is retried; a connection
cut mid-group or the broker away for a while (a proxy in front of it) loses nothing and
reports nothing done that was not confirmed; bad configuration stops the worker in one line."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import aio_pika
import pytest

from outbox import (
    Batch,
    CircuitBreaker,
    ConfigurationError,
    DownstreamUnavailableError,
    Outbox,
    RetryPolicy,
)
from outbox.sinks.rabbitmq import GUARANTEE, AsyncRabbitMQSink, RabbitMQSink
from outbox.testing import drain
from outbox.worker import Worker
from tests._proxy import Proxy
from tests._support import wait_for
from tests.conftest import reset_schema
from tests.models import SinkEvent
from tests.sinks._contract import (
    IMMEDIATE,
    OUTAGE_SECONDS,
    PATIENT,
    SECRET,
    Running,
    Stored,
    archived,
    breaker_state,
    buffer_empty,
    commit_events,
    event_id,
    event_rows,
    expected_messages,
    one_line_start_error,
    waiting_events,
    waiting_rows,
)
from tests.sinks.kinds.rabbitmq import (
    RABBITMQ_URL,
    ROUTING_KEY,
    RabbitMQDownstream,
    destination,
)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    """A proxy in front of the shared broker."""
    with Proxy("127.0.0.1", 5672) as running:
        yield running


def _through(proxy: Proxy) -> str:
    return RABBITMQ_URL.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")


def _nothing_lost(
    committed: list[int], expected: dict[str, dict[str, Any]], stored: list[Stored]
) -> Counter[str]:
    """Check every committed event is stored, each copy with the values it was committed
    with; the message ids stored more than once, with their counts."""
    assert sorted(committed) == sorted({event_id(m.message_id) for m in stored})
    assert all(expected[m.message_id] == m.values for m in stored)
    return Counter(m.message_id for m in stored if m.message_id in expected) - Counter(
        {message_id: 1 for message_id in expected}
    )


def test_an_unroutable_message_is_retried_then_dead_lettered_with_its_reason(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox
) -> None:
    """A message no queue is bound for is retried, then dead-lettered with the broker's
    reason; the routable messages of its group are done once."""
    sink = rabbitmq_downstream.sink(
        sync=sync,
        routing_key=lambda event: "nowhere" if event.account == "hooli" else ROUTING_KEY,
    )
    app.handler(SinkEvent, name="to_rabbitmq", batch_size=50, retry=IMMEDIATE, archive=True)(sink)
    ids = commit_events(app.engine, event_rows(20))
    hooli = set(ids[4::5])  # event_rows gives every fifth event to hooli

    drain(app)

    stored = rabbitmq_downstream.stored()
    reason = (
        f"unroutable (NO_ROUTE): no queue bound for routing key 'nowhere' on exchange "
        f"'{rabbitmq_downstream.name}'"
    )
    outcomes = archived(app.engine)
    assert sorted(set(ids) - hooli) == [event_id(m.message_id) for m in stored]
    assert {i: "succeeded" for i in ids if i not in hooli} == {
        i: status for i, (status, _) in outcomes.items() if i not in hooli
    }
    assert {i: "dead" for i in hooli} == {i: outcomes[i][0] for i in hooli}
    assert all(reason in (outcomes[i][1] or "") for i in hooli)


def test_a_partial_failure_retries_only_what_was_not_confirmed(sync: bool, app: Outbox) -> None:
    """A queue full to its limit makes the broker nack the rest of a group: only those are
    retried, and publishing them again stores each event once."""
    full = {"x-max-length": 6, "x-overflow": "reject-publish"}
    ids = commit_events(app.engine, event_rows(10))
    events = waiting_events(app.engine)
    with destination(arguments=full) as name:
        downstream = RabbitMQDownstream(name)
        sink = downstream.sink(sync=sync)
        first = Batch(events, group_id=uuid.uuid4(), attempt=1, handler="to_rabbitmq")
        again: list[Any] = []
        stored: list[list[Stored]] = []

        def retried() -> Batch[Any]:
            again.extend(e for e in events if e.id in first.retried_ids)
            return Batch(again, group_id=uuid.uuid4(), attempt=2, handler="to_rabbitmq")

        if sync:
            sink(first)
            stored.append(downstream.stored())
            sink(retried())
            sink.close()
        else:

            async def both() -> None:
                await sink(first)
                stored.append(await asyncio.to_thread(downstream.stored))
                await sink(retried())
                await sink.outbox_stop()

            asyncio.run(both())
        after = downstream.stored()

    assert ids[:6] == [event_id(m.message_id) for m in stored[0]]
    assert set(ids[6:]) == set(first.retried_ids)
    assert all("nacked by RabbitMQ" in reason for reason in first.retried_ids.values())
    assert ids == [event_id(m.message_id) for m in after]


def test_a_connection_cut_mid_group_loses_nothing(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox, proxy: Proxy
) -> None:
    """Connections cut in the middle of groups: every committed event is stored, duplicates
    only of the groups in flight, each with the same message id and values."""
    batch_size, concurrency, cuts = 100, 2, 3
    app.handler(SinkEvent, name="to_rabbitmq", batch_size=batch_size, retry=PATIENT)(
        rabbitmq_downstream.sink(sync=sync, url=_through(proxy))
    )
    committed = commit_events(app.engine, event_rows(1500))
    expected = expected_messages(app.engine, committed)

    with Running(app, concurrency=concurrency):
        for _ in range(cuts):
            # A published message is some 400 bytes: this lands inside a group.
            proxy.cut_after(batch_size * 150)
            wait_for(lambda: not proxy.armed, "a cut in the middle of a group")
        wait_for(lambda: buffer_empty(app.engine), "the buffer drained", OUTAGE_SECONDS)

    duplicates = _nothing_lost(committed, expected, rabbitmq_downstream.stored())
    assert [1] * cuts == proxy.cuts[:cuts]
    assert sum(duplicates.values()) <= cuts * batch_size * concurrency


def test_the_broker_away_for_a_while_opens_the_breaker_and_loses_nothing(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox, proxy: Proxy
) -> None:
    """The broker away (connections cut, new ones refused) mid-group: the circuit breaker
    opens; once it is back the breaker closes and every committed event is stored."""
    batch_size, concurrency = 100, 2
    app.handler(
        SinkEvent,
        name="to_rabbitmq",
        batch_size=batch_size,
        retry=PATIENT,
        circuit_breaker=CircuitBreaker(failures=2, probe_after=1, max_probe_after=2),
    )(rabbitmq_downstream.sink(sync=sync, url=_through(proxy)))
    committed = commit_events(app.engine, event_rows(1000))
    expected = expected_messages(app.engine, committed)

    with Running(app, concurrency=concurrency):
        proxy.cut_after(batch_size * 150, pause=True)
        wait_for(lambda: breaker_state(app) == "open", "the breaker open", OUTAGE_SECONDS)
        proxy.resume()
        wait_for(lambda: buffer_empty(app.engine), "the buffer drained", OUTAGE_SECONDS)
        wait_for(lambda: breaker_state(app) == "closed", "the breaker closed", OUTAGE_SECONDS)

    duplicates = _nothing_lost(committed, expected, rabbitmq_downstream.stored())
    assert sum(duplicates.values()) <= batch_size * concurrency


def test_an_unknown_exchange_stops_the_worker_at_start_with_one_line(
    sync: bool, app: Outbox
) -> None:
    """A sink naming an exchange that does not exist stops the worker: one line naming it."""
    missing = f"outbox-test-missing-{uuid.uuid4().hex[:8]}"
    sink_class = RabbitMQSink if sync else AsyncRabbitMQSink
    app.handler(SinkEvent, name="to_rabbitmq")(
        sink_class(RABBITMQ_URL, exchange=missing, routing_key=ROUTING_KEY)
    )
    commit_events(app.engine, event_rows(3))

    with pytest.raises(ConfigurationError) as raised:
        Worker(app, burst=True).run()

    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"handler 'to_rabbitmq': RabbitMQ at amqp://127.0.0.1:5672/: no exchange '{missing}'"
    )


def test_wrong_credentials_stop_the_worker_at_start_with_one_line_and_no_secret(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox
) -> None:
    """A password the broker refuses stops the worker: one line, the password masked."""
    app.handler(SinkEvent, name="to_rabbitmq")(
        rabbitmq_downstream.sink(sync=sync, url=f"amqp://guest:{SECRET}@127.0.0.1:5672/")
    )
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, DownstreamUnavailableError)

    assert message.startswith("handler 'to_rabbitmq': RabbitMQ at amqp://127.0.0.1:5672/: ")
    assert "ACCESS_REFUSED" in message


def test_the_broker_refusing_connections_stops_the_worker_at_start_with_one_line(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox, proxy: Proxy
) -> None:
    """A broker that refuses connections stops the worker: one line, no secret."""
    proxy.pause()
    url = f"amqp://guest:{SECRET}@127.0.0.1:{proxy.port}/"
    app.handler(SinkEvent, name="to_rabbitmq")(rabbitmq_downstream.sink(sync=sync, url=url))
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, DownstreamUnavailableError)

    assert f"RabbitMQ at amqp://127.0.0.1:{proxy.port}/" in message


def test_the_default_exchange_routes_by_queue_name(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox
) -> None:
    """With the default exchange the routing key is the queue's name."""
    sink_class = RabbitMQSink if sync else AsyncRabbitMQSink
    app.handler(SinkEvent, name="to_rabbitmq")(
        sink_class(RABBITMQ_URL, routing_key=rabbitmq_downstream.name)
    )
    committed = commit_events(app.engine, event_rows(5))

    drain(app)

    assert committed == [event_id(m.message_id) for m in rabbitmq_downstream.stored()]


def test_the_sink_names_its_broker_without_credentials_and_states_its_guarantee() -> None:
    """``downstream`` shows no password; the guarantee says what consumers de-duplicate by."""
    sink = AsyncRabbitMQSink(f"amqp://app:{SECRET}@rabbit.internal/orders", routing_key="x")

    assert ("RabbitMQ at amqp://rabbit.internal:5672/orders", GUARANTEE) == (
        sink.downstream,
        sink.outbox_guarantee,
    )
    assert "de-duplicate by message_id" in GUARANTEE


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"url": "http://127.0.0.1:5672/"}, "url"),
        ({"confirm_timeout": 0}, "confirm_timeout"),
        ({"routing_key": 42}, "routing_key"),
    ],
)
def test_a_wrong_argument_is_refused_naming_it(options: dict[str, Any], field: str) -> None:
    """A wrong constructor argument raises ConfigurationError naming the argument."""
    arguments: dict[str, Any] = {"routing_key": "x", **options}

    with pytest.raises(ConfigurationError, match=f"^{field}: "):
        AsyncRabbitMQSink(**arguments)


def test_the_key_header_comes_from_the_key_function_when_given(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox
) -> None:
    """``key=`` replaces the handler's ordering key as the ``outbox-key`` header."""
    app.handler(SinkEvent, name="to_rabbitmq", ordering_key="account")(
        rabbitmq_downstream.sink(sync=sync, key=lambda event: f"ref-{event.ref}")
    )
    commit_events(app.engine, event_rows(5))

    drain(app)

    stored = rabbitmq_downstream.stored()
    assert [f"ref-{m.values['ref']}" for m in stored] == [m.key for m in stored]


def test_an_event_that_cannot_be_made_a_message_fails_its_group_as_data(
    rabbitmq_downstream: RabbitMQDownstream, sync: bool, app: Outbox
) -> None:
    """A payload function that raises fails the attempt as the data's, naming the event;
    nothing of the group is published."""

    def payload(event: Any) -> bytes:
        if event.account == "globex":
            raise ValueError("no price for globex")
        return b"{}"

    app.handler(SinkEvent, name="to_rabbitmq", retry=RetryPolicy(max_attempts=1), archive=True)(
        rabbitmq_downstream.sink(sync=sync, payload=payload)
    )
    ids = commit_events(app.engine, event_rows(3))

    drain(app)

    errors = {(error or "").splitlines()[0] for _, error in archived(app.engine).values()}
    assert [] == rabbitmq_downstream.stored()
    assert {
        f"DataError: event {ids[1]} cannot be made a message: ValueError: no price for globex"
    } == (errors)


async def _published(queue_name: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every message on the queue: its body and its properties."""
    connection = await aio_pika.connect(RABBITMQ_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=True)
        published = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            properties = {
                "message_id": message.message_id,
                "headers": message.headers,
                "content_type": message.content_type,
                "delivery_mode": message.delivery_mode,
            }
            published.append((message.body, properties))
        return published


def test_a_group_read_from_its_rows_publishes_the_messages_its_events_would(
    sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The default messages of a group handed over as rows (as a worker does) are, body and
    properties, those of the same group handed over as events."""
    reset_schema(sqlite_url)
    with destination() as by_rows, destination() as by_events:
        sinks = {
            handler: RabbitMQSink(RABBITMQ_URL, exchange=name, routing_key=ROUTING_KEY)
            for handler, name in (("rows", by_rows), ("events", by_events))
        }
        for handler, sink in sinks.items():
            app = make_app(sqlite_url)
            app.handler(SinkEvent, name=handler, ordering_key="account")(sink)
            sink.outbox_start(app, app.get_handler(handler))
        ids = commit_events(app.engine, event_rows(30))
        rows, events = waiting_rows(app.engine), waiting_events(app.engine)
        group = uuid.uuid4()

        sinks["rows"](Batch(rows=rows, model=SinkEvent, group_id=group, attempt=1, handler="rows"))
        sinks["events"](Batch(events, group_id=group, attempt=1, handler="events"))

        for sink in sinks.values():
            sink.outbox_stop()
        published = {name: asyncio.run(_published(name)) for name in (by_rows, by_events)}
    assert len(ids) == len(published[by_events])
    assert published[by_events] == published[by_rows]
