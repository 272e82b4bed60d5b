"""The JetStream consumer on the shared server: each message has its effect once (with a sync
engine in a thread, and with an AsyncEngine), a re-sent or redelivered one none more, a
failing one is redelivered and a poison one terminated, a message without an id refused, and
what an outbox sink publishes arrives."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from structlog.testing import capture_logs

from outbox import Outbox
from outbox._core import log as _log
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox
from outbox.inbox.nats import ConsumeResult, JetStreamConsumer
from outbox.testing import drain
from tests._support import wait_for
from tests.inbox._support import (
    ALWAYS,
    INBOX,
    AsyncRecorder,
    Recorder,
    effect_counts,
    expired,
    kept_ids,
    kill,
    start_program,
)
from tests.models import SinkEvent
from tests.sinks._contract import IMMEDIATE, commit_events, event_rows, require_service
from tests.sinks.kinds.nats import NATS_URL, create, delete, make_sink, unique_name

DURABLE = "test-consumer"
ACK_WAIT_SECONDS = 1.0
"""A message taken by a consumer that died comes again this soon in the tests."""
DUPLICATE_WINDOW_SECONDS = 0.1
"""JetStream's own de-duplication, as short as it can be (100 ms): a re-send gets past it."""


@pytest.fixture
def stream() -> Iterator[str]:
    """A stream of its own on subjects ``<name>.>``, with a short duplicate window."""
    parts = urlsplit(NATS_URL)
    require_service("NATS", parts.hostname or "127.0.0.1", parts.port or 4222)
    name = unique_name()
    asyncio.run(create(name, duplicate_window=DUPLICATE_WINDOW_SECONDS))
    try:
        yield name
    finally:
        asyncio.run(delete(name))


async def _publish(stream_name: str, messages: tuple[tuple[str | None, str], ...]) -> None:
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        for message_id, body in messages:
            headers = None if message_id is None else {"Nats-Msg-Id": message_id}
            # Past JetStream's duplicate window, as a sink's re-send after a lost ack is.
            while (
                await jetstream.publish(f"{stream_name}.events", body.encode(), headers=headers)
            ).duplicate:
                await asyncio.sleep(DUPLICATE_WINDOW_SECONDS)
    finally:
        await client.close()


def publish(stream_name: str, *messages: tuple[str | None, str]) -> None:
    """Publish ``(Nats-Msg-Id, body)`` pairs, each stored (no header for None)."""
    asyncio.run(_publish(stream_name, messages))


async def _unsettled(stream_name: str) -> tuple[int, int]:
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        info = await client.jetstream().consumer_info(stream_name, DURABLE)
        return int(info.num_pending or 0), int(info.num_ack_pending or 0)
    finally:
        await client.close()


def unsettled(stream_name: str) -> tuple[int, int]:
    """The durable consumer's messages not delivered yet, and delivered not acknowledged."""
    return asyncio.run(_unsettled(stream_name))


def _consumer(database: Any, inbox: Inbox, stream_name: str, effect: Any, **options: Any) -> Any:
    options.setdefault("failure_pause", 0.05)
    return JetStreamConsumer(
        database,
        inbox,
        effect,
        stream=stream_name,
        durable=DURABLE,
        servers=NATS_URL,
        ack_wait=ACK_WAIT_SECONDS,
        **options,
    )


def consume(database: Any, inbox: Inbox, stream_name: str, effect: Any, **options: Any) -> Any:
    """One consumer's ``consume(max_messages=..., timeout=...)`` (given in ``options``)."""
    call = {k: options.pop(k) for k in ("max_messages", "timeout") if k in options}

    async def run() -> ConsumeResult:
        async with _consumer(database, inbox, stream_name, effect, **options) as consumer:
            result: ConsumeResult = await consumer.consume(**call)
            return result

    return asyncio.run(run())


def async_url(url: str) -> str:
    """The URL of the same database through an async driver."""
    parsed = make_url(url)
    driver = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}
    return parsed.set(drivername=driver[parsed.get_backend_name()]).render_as_string(False)


async def consume_once(database_url: str, stream_name: str, effect: Any) -> None:
    """What the killed program does: one message through an AsyncEngine."""
    engine = create_async_engine(async_url(database_url))
    try:
        consumer = _consumer(engine, Inbox(INBOX), stream_name, effect)
        async with consumer:
            await consumer.consume(max_messages=1, timeout=30)
    finally:
        await engine.dispose()


def test_new_messages_have_their_effect_once_and_are_acknowledged(
    any_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """Five new messages, a sync effect in a thread: five effects, nothing left unsettled."""
    app = app_on(any_database)
    publish(stream, *[(f"m{n}", f"body {n}") for n in range(5)])
    result = consume(app, app.inboxes[INBOX], stream, Recorder(), max_messages=5, timeout=5)
    assert ConsumeResult(received=5, new=5) == result
    assert Counter({f"m{n}": 1 for n in range(5)}) == effect_counts(app.engine)
    assert (0, 0) == unsettled(stream)


def test_an_async_engine_awaits_an_async_effect(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """With an AsyncEngine the effect is awaited with an AsyncSession, in one transaction."""
    app = app_on(sqlite_database)
    publish(stream, ("a1", "one"), ("a2", "two"))

    async def run() -> ConsumeResult:
        engine = create_async_engine(async_url(sqlite_database))
        try:
            consumer = _consumer(engine, app.inboxes[INBOX], stream, AsyncRecorder())
            async with consumer:
                result: ConsumeResult = await consumer.consume(max_messages=2, timeout=5)
                return result
        finally:
            await engine.dispose()

    assert ConsumeResult(received=2, new=2) == asyncio.run(run())
    assert Counter({"a1": 1, "a2": 1}) == effect_counts(app.engine)


def test_an_effect_of_the_other_kind_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox]
) -> None:
    """A sync effect with an AsyncEngine, an async one with a sync engine: each named."""
    app = app_on(sqlite_database)
    engine = create_async_engine(async_url(sqlite_database))
    refusals = []
    for database, effect in ((engine, Recorder()), (app, AsyncRecorder())):
        with pytest.raises(ConfigurationError) as raised:
            _consumer(database, app.inboxes[INBOX], "s", effect)
        refusals.append(str(raised.value))
    asyncio.run(engine.dispose())
    assert ["is a sync function", "is an async function"] == [
        phrase
        for phrase, refusal in zip(
            ("is a sync function", "is an async function"), refusals, strict=True
        )
        if phrase in refusal
    ]
    assert all("\n" not in r and "Recorder" in r for r in refusals)


def test_a_message_sent_again_with_its_id_has_one_effect(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """A re-send past JetStream's duplicate window, in the same batch and in a later one, is
    acknowledged without effect."""
    app = app_on(sqlite_database)
    inbox = app.inboxes[INBOX]
    publish(stream, ("a", "first"), ("a", "again"), ("b", "other"))
    first = consume(app, inbox, stream, Recorder(), max_messages=3, timeout=5)
    publish(stream, ("a", "later"))
    later = consume(app, inbox, stream, Recorder(), max_messages=1, timeout=5)
    assert (ConsumeResult(received=3, new=2, repeats=1), ConsumeResult(1, repeats=1)) == (
        first,
        later,
    )
    assert (Counter({"a": 1, "b": 1}), (0, 0)) == (effect_counts(app.engine), unsettled(stream))


def test_a_consumer_killed_after_its_commit_has_no_second_effect(
    postgres_effects: str, app_on: Callable[[str], Outbox], stream: str, tmp_path: Path
) -> None:
    """Killed between the commit and the ack: JetStream redelivers after ack_wait, and the
    next consumer acknowledges the message as a repeat."""
    app = app_on(postgres_effects)
    publish(stream, ("k1", "killed"))
    marker = tmp_path / "committed"
    process = start_program("nats", postgres_effects, stream, marker)
    try:
        wait_for(marker.exists, "the consumer's commit", timeout=30)
        assert Counter({"k1": 1}) == effect_counts(app.engine)
    finally:
        kill(process)
    result = consume(app, app.inboxes[INBOX], stream, Recorder(), max_messages=1, timeout=10)
    assert ConsumeResult(received=1, repeats=1) == result
    assert (Counter({"k1": 1}), (0, 0)) == (effect_counts(app.engine), unsettled(stream))


def test_an_effect_that_raises_is_redelivered_and_succeeds_next_time(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """The failing message alone is nak-ed with a delay; redelivered, it has its effect."""
    app = app_on(sqlite_database)
    publish(stream, ("ok", "fine"), ("flaky", "fails once"))
    result = consume(
        app, app.inboxes[INBOX], stream, Recorder({"flaky": 1}), max_messages=3, timeout=5
    )
    assert ConsumeResult(received=3, new=2, failed=1) == result
    assert (Counter({"ok": 1, "flaky": 1}), (0, 0)) == (
        effect_counts(app.engine),
        unsettled(stream),
    )


def test_a_message_that_always_fails_is_terminated_after_the_bound(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """At its third delivery (num_delivered) the message is term-ed; an error line names it."""
    app = app_on(sqlite_database)
    publish(stream, ("poison", "always fails"))
    with capture_logs() as logs:
        result = consume(
            app,
            app.inboxes[INBOX],
            stream,
            Recorder({"poison": ALWAYS}),
            max_deliveries=3,
            max_messages=3,
            timeout=5,
        )
    assert ConsumeResult(received=3, failed=2, dead_lettered=1) == result
    assert [("error", "poison", 3, "RuntimeError: the effect of poison failed")] == [
        (line["log_level"], line["message_id"], line["deliveries"], line["error"])
        for line in logs
        if line["event"] == _log.INBOX_DEAD_LETTERED
    ]
    assert (Counter(), (0, 0)) == (effect_counts(app.engine), unsettled(stream))


def test_a_message_without_an_id_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """Terminated at once without an effect, with one error line."""
    app = app_on(sqlite_database)
    publish(stream, (None, "anonymous"), ("named", "has an id"))
    with capture_logs() as logs:
        result = consume(app, app.inboxes[INBOX], stream, Recorder(), max_messages=2, timeout=5)
    refused = [line for line in logs if line["event"] == _log.INBOX_MESSAGE_REFUSED]
    assert ConsumeResult(received=2, new=1, dead_lettered=1, refused=1) == result
    assert (1, "error") == (len(refused), refused[0]["log_level"])
    assert (Counter({"named": 1}), (0, 0)) == (effect_counts(app.engine), unsettled(stream))


def test_what_a_jetstream_sink_publishes_has_its_effect_once_each(
    sqlite_database: str, app_on: Callable[[str], Outbox]
) -> None:
    """An outbox sink publishes 30 events (drained); the consumer has 30 effects."""
    app = app_on(sqlite_database)
    name = unique_name()
    require_service("NATS", "127.0.0.1", 4222)
    asyncio.run(create(name))  # the sink's check wants a long duplicate window
    try:
        app.handler(SinkEvent, name="to_nats", batch_size=10, retry=IMMEDIATE)(
            make_sink(name, sync=True)
        )
        ids = commit_events(app.engine, event_rows(30))
        drain(app)
        result = consume(app, app.inboxes[INBOX], name, Recorder(), max_messages=30, timeout=5)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(delete(name))
    assert ConsumeResult(received=30, new=30) == result
    assert Counter({f"test_sink_events-{i}": 1 for i in ids}) == effect_counts(app.engine)


def test_run_returns_once_stop_is_called(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """run() applies what comes, and returns its counts once stop() is called."""
    app = app_on(sqlite_database)
    publish(stream, ("r1", "one"), ("r2", "two"))
    consumer = _consumer(app, app.inboxes[INBOX], stream, Recorder())

    async def run_then_stop() -> ConsumeResult:
        running = asyncio.create_task(consumer.run(handle_signals=False))
        while sum(effect_counts(app.engine).values()) < 2 and not running.done():
            await asyncio.sleep(0.05)
        consumer.stop()
        result: ConsumeResult = await asyncio.wait_for(running, timeout=10)
        return result

    assert ConsumeResult(received=2, new=2) == asyncio.run(run_then_stop())
    assert (0, 0) == unsettled(stream)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_a_database_outage_holds_the_batch_and_loses_nothing(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str, driver: str
) -> None:
    """With the database unreachable (asyncpg's bare socket errors too), nothing is
    acknowledged; once it answers, the message has its effect."""
    app = app_on(sqlite_database)
    publish(stream, ("held", "while down"))
    down = create_async_engine(f"postgresql+{driver}://postgres@127.0.0.1:1/none")

    async def while_down() -> ConsumeResult:
        try:
            consumer = _consumer(
                down, app.inboxes[INBOX], stream, AsyncRecorder(), max_deliveries=1
            )
            async with consumer:
                result: ConsumeResult = await consumer.consume(max_messages=1, timeout=1)
                return result
        finally:
            await down.dispose()

    held = asyncio.run(while_down())
    applied = consume(app, app.inboxes[INBOX], stream, Recorder(), max_messages=1, timeout=5)
    assert (ConsumeResult(received=1, failed=1), ConsumeResult(received=1, new=1)) == (
        held,
        applied,
    )
    assert (Counter({"held": 1}), (0, 0)) == (effect_counts(app.engine), unsettled(stream))


def test_a_stream_that_does_not_exist_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox]
) -> None:
    """No waiting out a missing stream as if it were an outage: one line naming it."""
    require_service("NATS", "127.0.0.1", 4222)
    app = app_on(sqlite_database)
    missing = unique_name()
    with pytest.raises(ConfigurationError, match=f"no stream '{missing}'") as raised:
        consume(app, app.inboxes[INBOX], missing, Recorder(), timeout=5)
    assert "\n" not in str(raised.value)


def test_an_async_engine_s_consumer_prunes_through_it(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """The first consume() on an AsyncEngine ends with a pruning pass (prune_async)."""
    app = app_on(sqlite_database)
    brief = Inbox("brief", horizon=0.001)
    with Session(app.engine) as session, session.begin():
        brief.receive_many(session, ["old1", "old2"])
        app.inboxes[INBOX].receive(session, "kept")
    wait_for(lambda: expired(app.engine, brief), "the ids past their horizon")

    async def consume_nothing() -> None:
        engine = create_async_engine(async_url(sqlite_database))
        try:
            async with _consumer(engine, app.inboxes[INBOX], stream, AsyncRecorder()) as consumer:
                await consumer.consume(timeout=0.1)
        finally:
            await engine.dispose()

    asyncio.run(consume_nothing())
    assert {(INBOX, "kept")} == kept_ids(app.engine)


def test_a_subject_filter_outside_the_stream_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """JetStream refuses the consumer (a 400): a configuration to correct, not an outage to
    wait out."""
    app = app_on(sqlite_database)
    with pytest.raises(ConfigurationError, match="refused the consumer") as raised:
        consume(app, app.inboxes[INBOX], stream, Recorder(), subject="elsewhere.>", timeout=5)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "servers", ["http://user:s3cret@127.0.0.1:4222", 123, [], ["nats://"], ["tls://t:s3cret@"]]
)
def test_servers_that_are_not_nats_urls_are_refused_in_one_line(servers: Any) -> None:
    """Refused at construction, naming the argument."""
    engine = create_engine("sqlite://")
    with pytest.raises(ConfigurationError, match=r"^servers: ") as raised:
        JetStreamConsumer(
            engine, Inbox(INBOX), Recorder(), stream="S", durable="d", servers=servers
        )
    message = str(raised.value)
    assert (False, False) == ("\n" in message, "s3cret" in message)  # one line, no password


def test_a_fetch_that_times_out_bare_is_no_lost_connection(
    sqlite_database: str,
    app_on: Callable[[str], Outbox],
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nats-py's fetch may raise a bare asyncio.TimeoutError when no message came: an idle
    consumer keeps its connection."""
    app = app_on(sqlite_database)
    fetch = nats.js.JetStreamContext.PullSubscription.fetch

    async def times_out_bare(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise TimeoutError from None  # what asyncio.wait_for raises, bare

    monkeypatch.setattr(nats.js.JetStreamContext.PullSubscription, "fetch", times_out_bare)
    with capture_logs() as logs:
        result = consume(app, app.inboxes[INBOX], stream, Recorder(), timeout=0.5)
    assert ConsumeResult() == result
    assert [] == [line for line in logs if line["event"] == _log.INBOX_BROKER_ERROR]
