"""The RabbitMQ consumer on the shared broker: each message has its effect once, a re-sent or
redelivered one none more, a failing one is redelivered and a poison one dead-lettered, a
message without an id refused, and what an outbox sink publishes arrives."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from structlog.testing import capture_logs

from outbox import Outbox
from outbox._core import log as _log
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox
from outbox.inbox.rabbitmq import ConsumeResult, RabbitMQConsumer
from outbox.sinks.rabbitmq import RabbitMQSink
from outbox.testing import drain
from tests._proxy import Proxy
from tests._support import wait_for
from tests.inbox._support import (
    ALWAYS,
    INBOX,
    REPOSITORY,
    Recorder,
    effect_counts,
    expired,
    kept_ids,
    kill,
    start_program,
)
from tests.models import SinkEvent
from tests.sinks._contract import IMMEDIATE, commit_events, event_rows, require_service

RABBITMQ_URL = os.environ.get("OUTBOX_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


def _channel_do(work: Callable[[Any], Any]) -> Any:
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        return work(connection.channel())
    finally:
        connection.close()


@contextlib.contextmanager
def queue(**arguments: Any) -> Iterator[str]:
    """A durable queue of its own (with ``arguments``), deleted at the end."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    name = f"outbox-test-{uuid.uuid4().hex[:12]}"
    _channel_do(lambda ch: ch.queue_declare(name, durable=True, arguments=arguments or None))
    try:
        yield name
    finally:
        _channel_do(lambda ch: ch.queue_delete(name))


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    """A classic queue of its own for one test."""
    with queue() as name:
        yield name


def publish(queue_name: str, *messages: tuple[str | None, str]) -> None:
    """Publish ``(message_id, body)`` pairs to ``queue_name`` through the default exchange."""

    def send(channel: Any) -> None:
        for message_id, body in messages:
            properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
            channel.basic_publish("", queue_name, body.encode(), properties)

    _channel_do(send)


def waiting(queue_name: str) -> int:
    """Messages ready in ``queue_name``."""
    return int(
        _channel_do(lambda ch: ch.queue_declare(queue_name, passive=True)).method.message_count
    )


def _consumer(app: Outbox, queue_name: str, effect: Any, **options: Any) -> RabbitMQConsumer:
    options.setdefault("failure_pause", 0.05)
    return RabbitMQConsumer(
        app, app.inboxes[INBOX], effect, queue=queue_name, url=RABBITMQ_URL, **options
    )


def test_new_messages_have_their_effect_once_and_are_acknowledged(
    any_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """Five new messages: five effects in one batch, and nothing left in the queue."""
    app = app_on(any_database)
    publish(rabbitmq_queue, *[(f"m{n}", f"body {n}") for n in range(5)])
    recorder = Recorder()
    with _consumer(app, rabbitmq_queue, recorder) as consumer:
        result = consumer.consume(max_messages=5, timeout=5)
    assert ConsumeResult(received=5, new=5) == result
    assert Counter({f"m{n}": 1 for n in range(5)}) == effect_counts(app.engine)
    assert 0 == waiting(rabbitmq_queue)


def test_a_message_sent_again_with_its_id_has_one_effect(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """A sink's re-send, in the same batch and in a later one, is acknowledged without effect."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("a", "first"), ("a", "again"), ("b", "other"))
    with _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        first = consumer.consume(max_messages=3, timeout=5)
        publish(rabbitmq_queue, ("a", "later"))
        later = consumer.consume(max_messages=1, timeout=5)
    assert (ConsumeResult(received=3, new=2, repeats=1), ConsumeResult(1, repeats=1)) == (
        first,
        later,
    )
    assert Counter({"a": 1, "b": 1}) == effect_counts(app.engine)
    assert 0 == waiting(rabbitmq_queue)


def test_a_consumer_killed_after_its_commit_has_no_second_effect(
    postgres_effects: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str, tmp_path: Path
) -> None:
    """Killed between the commit and the ack: RabbitMQ redelivers, and the next consumer
    acknowledges the message as a repeat."""
    app = app_on(postgres_effects)
    publish(rabbitmq_queue, ("k1", "killed"))
    marker = tmp_path / "committed"
    process = start_program("rabbitmq", postgres_effects, rabbitmq_queue, marker)
    try:
        wait_for(marker.exists, "the consumer's commit", timeout=30)
        assert Counter({"k1": 1}) == effect_counts(app.engine)
    finally:
        kill(process)
    with _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        result = consumer.consume(max_messages=1, timeout=10)
    assert ConsumeResult(received=1, repeats=1) == result
    assert Counter({"k1": 1}) == effect_counts(app.engine)
    assert 0 == waiting(rabbitmq_queue)


def test_an_effect_that_raises_is_redelivered_and_succeeds_next_time(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """The failing message alone is given back; the others of its batch commit at once."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("ok", "fine"), ("flaky", "fails once"))
    with _consumer(app, rabbitmq_queue, Recorder({"flaky": 1})) as consumer:
        result = consumer.consume(max_messages=3, timeout=2)
    assert ConsumeResult(received=3, new=2, failed=1) == result
    assert Counter({"ok": 1, "flaky": 1}) == effect_counts(app.engine)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_a_message_that_always_fails_is_dead_lettered_after_the_bound(
    sqlite_database: str, app_on: Callable[[str], Outbox], queue_type: str
) -> None:
    """Rejected without requeue at its third delivery (a quorum queue's x-delivery-count, or
    the consumer's own count on a classic queue): the dead-letter queue has it, an error line
    names it."""
    app = app_on(sqlite_database)
    with (
        queue() as dead,
        queue(
            **{
                "x-queue-type": queue_type,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead,
            }
        ) as source,
    ):
        publish(source, ("poison", "always fails"))
        with (
            capture_logs() as logs,
            _consumer(app, source, Recorder({"poison": ALWAYS}), max_deliveries=3) as consumer,
        ):
            result = consumer.consume(max_messages=3, timeout=5)
        dead_letters = wait_for(lambda: waiting(dead), "the dead letter")
    assert (ConsumeResult(received=3, failed=2, dead_lettered=1), 1) == (result, dead_letters)
    assert [("error", "poison", 3, "RuntimeError: the effect of poison failed")] == [
        (line["log_level"], line["message_id"], line["deliveries"], line["error"])
        for line in logs
        if line["event"] == _log.INBOX_DEAD_LETTERED
    ]
    assert Counter() == effect_counts(app.engine)


def test_a_message_without_an_id_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """Rejected at once without an effect, with one error line; the next message goes on."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, (None, "anonymous"), ("named", "has an id"))
    with capture_logs() as logs, _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        result = consumer.consume(max_messages=2, timeout=5)
    refused = [line for line in logs if line["event"] == _log.INBOX_MESSAGE_REFUSED]
    assert ConsumeResult(received=2, new=1, dead_lettered=1, refused=1) == result
    assert (1, "error") == (len(refused), refused[0]["log_level"])
    assert "\n" not in refused[0]["error"]
    assert (Counter({"named": 1}), 0) == (effect_counts(app.engine), waiting(rabbitmq_queue))


def test_what_a_rabbitmq_sink_publishes_has_its_effect_once_each(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """An outbox sink publishes 30 events (drained); the consumer has 30 effects."""
    app = app_on(sqlite_database)
    sink = RabbitMQSink(RABBITMQ_URL, routing_key=rabbitmq_queue)
    app.handler(SinkEvent, name="to_rabbitmq", batch_size=10, retry=IMMEDIATE)(sink)
    ids = commit_events(app.engine, event_rows(30))
    drain(app)
    with _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        result = consumer.consume(max_messages=30, timeout=5)
    assert ConsumeResult(received=30, new=30) == result
    assert Counter({f"test_sink_events-{i}": 1 for i in ids}) == effect_counts(app.engine)


def test_an_async_effect_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox]
) -> None:
    """The sync consumer names the async function it was given."""

    async def apply(session: Any, messages: Any) -> None:
        pass

    app = app_on(sqlite_database)
    with pytest.raises(ConfigurationError, match=r"effect .*apply is an async function") as raised:
        RabbitMQConsumer(app, app.inboxes[INBOX], apply, queue="q")
    assert "\n" not in str(raised.value)


def test_a_database_outage_holds_the_batch_and_loses_nothing(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """With the database unreachable, nothing is acknowledged; once it answers, the message
    has its effect."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("held", "while down"))
    down = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    consumer = RabbitMQConsumer(
        down, app.inboxes[INBOX], Recorder(), queue=rabbitmq_queue, url=RABBITMQ_URL
    )
    with consumer:
        held = consumer.consume(max_messages=1, timeout=1)
    down.dispose()
    with _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        applied = consumer.consume(max_messages=1, timeout=5)
    assert (ConsumeResult(received=1, failed=1), ConsumeResult(received=1, new=1)) == (
        held,
        applied,
    )
    assert Counter({"held": 1}) == effect_counts(app.engine)


def test_run_returns_once_stop_is_called(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """run() in a thread applies what comes, and returns its counts after stop()."""
    app = app_on(sqlite_database)
    consumer = _consumer(app, rabbitmq_queue, Recorder())
    results: list[ConsumeResult] = []
    thread = threading.Thread(target=lambda: results.append(consumer.run()))
    thread.start()
    try:
        publish(rabbitmq_queue, ("r1", "one"), ("r2", "two"))
        wait_for(lambda: 2 == sum(effect_counts(app.engine).values()), "two effects")
    finally:
        consumer.stop()
        thread.join(timeout=10)
    assert (False, [ConsumeResult(received=2, new=2)]) == (thread.is_alive(), results)


def test_sigterm_stops_a_running_consumer_cleanly(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """run() in a process of its own: SIGTERM ends it with exit code 0 and its counts."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("t1", "one"))
    program = [sys.executable, "-m", "tests.inbox.consumer_program"]
    process = subprocess.Popen(
        [*program, "rabbitmq", sqlite_database, rabbitmq_queue],
        cwd=REPOSITORY,
        env={**os.environ, "OUTBOX_TEST_RUN": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: 1 == sum(effect_counts(app.engine).values()), "the effect")
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert 0 == process.returncode, stderr
    assert "received=1, new=1" in stdout
    assert 0 == waiting(rabbitmq_queue)


def test_a_consumer_prunes_ids_past_their_horizon(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """The first consume() ends with a pruning pass: ids past their horizon are deleted, the
    others kept."""
    app = app_on(sqlite_database)
    brief = Inbox("brief", horizon=0.001)
    with Session(app.engine) as session, session.begin():
        brief.receive_many(session, ["old1", "old2"])
        app.inboxes[INBOX].receive(session, "kept")
    wait_for(lambda: expired(app.engine, brief), "the ids past their horizon")
    with _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        consumer.consume(timeout=0.1)
    assert {(INBOX, "kept")} == kept_ids(app.engine)


def test_a_queue_that_does_not_exist_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox]
) -> None:
    """No waiting out a missing queue as if it were an outage: one line naming it."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    app = app_on(sqlite_database)
    missing = f"outbox-test-missing-{uuid.uuid4().hex[:8]}"
    with (
        pytest.raises(ConfigurationError, match=f"no queue '{missing}'") as raised,
        _consumer(app, missing, Recorder()) as consumer,
    ):
        consumer.consume(timeout=5)
    assert "\n" not in str(raised.value)


def test_a_consumer_cut_from_the_broker_connects_again_and_loses_nothing(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """The connection cut and refused for a while: one warning, then the consumer connects
    again and has every message's effect once."""
    app = app_on(sqlite_database)
    with Proxy("127.0.0.1", 5672) as proxy, capture_logs() as logs:
        url = RABBITMQ_URL.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
        consumer = RabbitMQConsumer(
            app, app.inboxes[INBOX], Recorder(), queue=rabbitmq_queue, url=url
        )
        thread = threading.Thread(target=lambda: consumer.run(handle_signals=False))
        thread.start()
        try:
            publish(rabbitmq_queue, ("before", "1"))
            wait_for(lambda: 1 == sum(effect_counts(app.engine).values()), "the first effect")
            proxy.pause()
            proxy.cut()
            publish(rabbitmq_queue, ("during", "2"), ("during2", "3"))
            wait_for(
                lambda: any(line["event"] == _log.INBOX_BROKER_ERROR for line in logs),
                "the consumer to see the cut",
            )
            proxy.resume()
            wait_for(lambda: 3 == sum(effect_counts(app.engine).values()), "every effect")
        finally:
            consumer.stop()
            thread.join(timeout=10)
    broker_errors = [line for line in logs if line["event"] == _log.INBOX_BROKER_ERROR]
    assert Counter({"before": 1, "during": 1, "during2": 1}) == effect_counts(app.engine)
    assert (1, 0) == (len(broker_errors), waiting(rabbitmq_queue))


def test_a_missing_inbox_table_is_refused_in_one_line_and_loses_nothing(
    sqlite_url: str, rabbitmq_queue: str
) -> None:
    """A consumer started before the migrations: a ConfigurationError naming the table, and
    the message given back, neither dead-lettered nor counted as its effect failing."""
    publish(rabbitmq_queue, ("early", "before the migration"))
    engine = create_engine(sqlite_url)
    consumer = RabbitMQConsumer(
        engine, Inbox(INBOX), Recorder(), queue=rabbitmq_queue, url=RABBITMQ_URL
    )
    try:
        with consumer, pytest.raises(ConfigurationError, match="inbox table is missing") as raised:
            consumer.consume(max_messages=1, timeout=5)
    finally:
        engine.dispose()
    assert "\n" not in str(raised.value)
    assert 1 == wait_for(lambda: waiting(rabbitmq_queue), "the message given back")


def test_a_database_refusing_the_ids_holds_the_batch(
    postgres_effects: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """A read-only database (a standby) fails outside the effect: the batch is held and given
    back, not dead-lettered, however many times it is tried."""
    app = app_on(postgres_effects)
    publish(rabbitmq_queue, ("standby", "read only"))
    read_only = create_engine(
        postgres_effects, connect_args={"options": "-c default_transaction_read_only=on"}
    )
    consumer = RabbitMQConsumer(
        read_only,
        app.inboxes[INBOX],
        Recorder(),
        queue=rabbitmq_queue,
        url=RABBITMQ_URL,
        max_deliveries=1,
    )
    try:
        with consumer:
            held = consumer.consume(max_messages=1, timeout=1)
    finally:
        read_only.dispose()
    assert ConsumeResult(received=1, failed=1) == held
    assert 1 == wait_for(lambda: waiting(rabbitmq_queue), "the message given back")


def test_a_sync_effect_returning_an_awaitable_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """A plain function that returns a coroutine: refused, and no id is kept without its
    effect."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("lazy", "never awaited"))

    async def work() -> None:
        pass

    def effect(session: Session, messages: list[Any]) -> object:
        return work()

    consumer = _consumer(app, rabbitmq_queue, effect)
    with consumer, pytest.raises(ConfigurationError, match="returned an awaitable") as raised:
        consumer.consume(max_messages=1, timeout=5)
    assert "\n" not in str(raised.value)
    assert set() == kept_ids(app.engine)


def test_an_autocommit_engine_is_refused_in_one_line(
    sqlite_database: str, rabbitmq_queue: str
) -> None:
    """An engine whose connections commit each statement alone: refused, the message given
    back rather than counted as its effect failing."""
    publish(rabbitmq_queue, ("alone", "autocommit"))
    engine = create_engine(sqlite_database, isolation_level="AUTOCOMMIT")
    consumer = RabbitMQConsumer(
        engine, Inbox(INBOX), Recorder(), queue=rabbitmq_queue, url=RABBITMQ_URL
    )
    try:
        with consumer, pytest.raises(ConfigurationError, match="AUTOCOMMIT") as raised:
            consumer.consume(max_messages=1, timeout=5)
    finally:
        engine.dispose()
    assert "\n" not in str(raised.value)
    assert 1 == wait_for(lambda: waiting(rabbitmq_queue), "the message given back")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("batch_size", 0.5),
        ("batch_size", 100_000),
        ("batch_size", float("inf")),
        ("max_deliveries", 0.5),
        ("prune_chunks", 2.5),
        ("failure_pause", 1e300),
        ("prune_interval", float("nan")),
    ],
)
def test_a_setting_out_of_its_range_is_refused_in_one_line(name: str, value: float) -> None:
    """Counts are whole numbers from 1 to their maximum, pauses finite seconds up to a day:
    refused at construction, naming the argument."""
    engine = create_engine("sqlite://")
    with pytest.raises(ConfigurationError, match=f": {name} must be") as raised:
        RabbitMQConsumer(engine, Inbox(INBOX), Recorder(), queue="q", **{name: value})
    assert "\n" not in str(raised.value)


PROGRAM = [sys.executable, "-m", "tests.inbox.consumer_program"]


def test_a_second_sigterm_ends_the_process_at_once(
    postgres_effects: str, rabbitmq_queue: str, tmp_path: Path
) -> None:
    """The first SIGTERM waits for the batch in hand; a second one, while it is still held,
    ends the process as SIGTERM's default does."""
    publish(rabbitmq_queue, ("stuck", "held after its commit"))
    marker = tmp_path / "committed"
    process = subprocess.Popen(
        [*PROGRAM, "rabbitmq", postgres_effects, rabbitmq_queue],
        cwd=REPOSITORY,
        env={**os.environ, "OUTBOX_TEST_RUN": "1", "OUTBOX_TEST_DIE_AFTER_COMMIT": str(marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(marker.exists, "the consumer's commit", timeout=30)
        process.send_signal(signal.SIGTERM)

        def signalled_again() -> int | None:
            # Two signals sent at once may reach the handler as one: sent again until it ends.
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            return process.poll()

        returncode = wait_for(signalled_again, "the process ending", timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert -signal.SIGTERM == returncode


def test_a_consumer_cancelled_by_the_broker_consumes_again(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """Its queue deleted and declared again (basic.cancel): the consumer says so once and
    connects again, rather than idling for ever."""
    app = app_on(sqlite_database)
    with capture_logs() as logs, _consumer(app, rabbitmq_queue, Recorder()) as consumer:
        consumer.consume(timeout=0.2)
        _channel_do(lambda ch: ch.queue_delete(rabbitmq_queue))
        _channel_do(lambda ch: ch.queue_declare(rabbitmq_queue, durable=True))
        publish(rabbitmq_queue, ("after", "re-declared"))
        result = consumer.consume(max_messages=1, timeout=3)
    assert ConsumeResult(received=1, new=1) == result
    assert 1 == len([line for line in logs if line["event"] == _log.INBOX_BROKER_ERROR])


def test_a_socket_error_of_the_effect_counts_against_its_message(
    sqlite_database: str, app_on: Callable[[str], Outbox], rabbitmq_queue: str
) -> None:
    """An effect whose own service refuses the connection has failed: counted against the
    message (here dead-lettered at once), not held as if the database were down."""
    app = app_on(sqlite_database)
    publish(rabbitmq_queue, ("called", "a service that is down"))

    def effect(session: Session, messages: list[Any]) -> None:
        raise ConnectionRefusedError("the service is down")

    with _consumer(app, rabbitmq_queue, effect, max_deliveries=1) as consumer:
        result = consumer.consume(max_messages=1, timeout=2)
    assert ConsumeResult(received=1, dead_lettered=1) == result
