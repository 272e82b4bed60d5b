"""The Redis Streams consumer on the shared server: each entry has its effect once, a re-sent
or reclaimed one none more, a failing one is claimed again and a poison one moved to the dead
stream, an entry without an id refused, and what an outbox sink appends arrives."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from structlog.testing import capture_logs

from outbox import Outbox
from outbox._core import log as _log
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox
from outbox.inbox import _consumer as _consumer_module
from outbox.inbox.redis import ConsumeResult, RedisStreamConsumer
from outbox.sinks.redis import RedisStreamSink
from outbox.testing import drain
from tests._support import wait_for
from tests.inbox._support import (
    ALWAYS,
    INBOX,
    Recorder,
    effect_counts,
    expired,
    kept_ids,
    kill,
    start_program,
)
from tests.models import SinkEvent
from tests.sinks._contract import IMMEDIATE, commit_events, event_rows, require_service
from tests.sinks.kinds.redis import redis_url

REDIS_URL = redis_url()
GROUP = "test-group"
CLAIM_IDLE_SECONDS = 0.3
"""Pending entries are claimed this soon in the tests (30 s by default)."""


def consumer_options(stream: str, name: str) -> dict[str, Any]:
    """The stream, group, consumer name and claim time every test's consumer has."""
    return {"stream": stream, "group": GROUP, "consumer": name, "claim_idle": CLAIM_IDLE_SECONDS}


@pytest.fixture
def stream() -> Iterator[str]:
    """A stream of its own for one test; it and its dead stream deleted after."""
    parts = urlsplit(REDIS_URL)
    require_service("Redis", parts.hostname or "127.0.0.1", parts.port or 6379)
    name = f"outbox-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with redis.Redis.from_url(REDIS_URL) as client:
            client.delete(name, f"{name}:dead")


def append(stream_name: str, *messages: tuple[str | None, str]) -> None:
    """Append ``(id, payload)`` entries as the sink does (no ``id`` field for None)."""
    with redis.Redis.from_url(REDIS_URL) as client:
        for message_id, payload in messages:
            fields = {"payload": payload} if message_id is None else {"id": message_id}
            fields["payload"] = payload
            client.xadd(stream_name, fields)  # type: ignore[arg-type]


def pending(stream_name: str) -> int:
    """Entries of the group delivered and not acknowledged."""
    with redis.Redis.from_url(REDIS_URL) as client:
        return int(client.xpending(stream_name, GROUP)["pending"])


def dead_letters(stream_name: str) -> list[dict[bytes, bytes]]:
    """The entries of the dead stream."""
    with redis.Redis.from_url(REDIS_URL) as client:
        return [fields for _, fields in client.xrange(f"{stream_name}:dead")]


def _consumer(app: Outbox, stream_name: str, effect: Any, **options: Any) -> RedisStreamConsumer:
    return RedisStreamConsumer(
        app,
        app.inboxes[INBOX],
        effect,
        url=REDIS_URL,
        **{**consumer_options(stream_name, "tester"), **options},
    )


def test_new_entries_have_their_effect_once_and_are_acknowledged(
    any_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """Five new entries: five effects, none left pending."""
    app = app_on(any_database)
    append(stream, *[(f"m{n}", f"body {n}") for n in range(5)])
    with _consumer(app, stream, Recorder()) as consumer:
        result = consumer.consume(max_messages=5, timeout=5)
    assert ConsumeResult(received=5, new=5) == result
    assert Counter({f"m{n}": 1 for n in range(5)}) == effect_counts(app.engine)
    assert 0 == pending(stream)


def test_an_entry_appended_again_with_its_id_has_one_effect(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """A sink's re-send, in the same batch and in a later one, is acknowledged without effect."""
    app = app_on(sqlite_database)
    append(stream, ("a", "first"), ("a", "again"), ("b", "other"))
    with _consumer(app, stream, Recorder()) as consumer:
        first = consumer.consume(max_messages=3, timeout=5)
        append(stream, ("a", "later"))
        later = consumer.consume(max_messages=1, timeout=5)
    assert (ConsumeResult(received=3, new=2, repeats=1), ConsumeResult(1, repeats=1)) == (
        first,
        later,
    )
    assert (Counter({"a": 1, "b": 1}), 0) == (effect_counts(app.engine), pending(stream))


def test_an_entry_of_a_consumer_killed_after_its_commit_has_no_second_effect(
    postgres_effects: str, app_on: Callable[[str], Outbox], stream: str, tmp_path: Path
) -> None:
    """Killed between the commit and the XACK: the entry stays pending, another consumer
    claims it and acknowledges it as a repeat."""
    app = app_on(postgres_effects)
    append(stream, ("k1", "killed"))
    marker = tmp_path / "committed"
    process = start_program("redis", postgres_effects, stream, marker)
    try:
        wait_for(marker.exists, "the consumer's commit", timeout=30)
        assert Counter({"k1": 1}) == effect_counts(app.engine)
    finally:
        kill(process)
    with _consumer(app, stream, Recorder()) as consumer:
        result = consumer.consume(max_messages=1, timeout=5)
    assert ConsumeResult(received=1, repeats=1) == result
    assert (Counter({"k1": 1}), 0) == (effect_counts(app.engine), pending(stream))


def test_an_effect_that_raises_is_claimed_again_and_succeeds_next_time(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """The failing entry alone stays pending; claimed again, it has its effect."""
    app = app_on(sqlite_database)
    append(stream, ("ok", "fine"), ("flaky", "fails once"))
    with _consumer(app, stream, Recorder({"flaky": 1})) as consumer:
        result = consumer.consume(max_messages=3, timeout=5)
    assert ConsumeResult(received=3, new=2, failed=1) == result
    assert (Counter({"ok": 1, "flaky": 1}), 0) == (effect_counts(app.engine), pending(stream))


def test_an_entry_that_always_fails_goes_to_the_dead_stream_after_the_bound(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """At its third delivery (XPENDING's count) the entry is appended to the dead stream with
    the error and acknowledged; an error line names it."""
    app = app_on(sqlite_database)
    append(stream, ("poison", "always fails"))
    with (
        capture_logs() as logs,
        _consumer(app, stream, Recorder({"poison": ALWAYS}), max_deliveries=3) as consumer,
    ):
        result = consumer.consume(max_messages=3, timeout=5)
    dead = dead_letters(stream)
    assert ConsumeResult(received=3, failed=2, dead_lettered=1) == result
    assert [(b"poison", b"3", b"RuntimeError: the effect of poison failed")] == [
        (d[b"id"], d[b"deliveries"], d[b"error"]) for d in dead
    ]
    assert [("error", "poison")] == [
        (line["log_level"], line["message_id"])
        for line in logs
        if line["event"] == _log.INBOX_DEAD_LETTERED
    ]
    assert (Counter(), 0) == (effect_counts(app.engine), pending(stream))


def test_an_entry_without_an_id_is_refused_in_one_line(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """Moved to the dead stream at once without an effect, with one error line."""
    app = app_on(sqlite_database)
    append(stream, (None, "anonymous"), ("named", "has an id"))
    with capture_logs() as logs, _consumer(app, stream, Recorder()) as consumer:
        result = consumer.consume(max_messages=2, timeout=5)
    refused = [line for line in logs if line["event"] == _log.INBOX_MESSAGE_REFUSED]
    assert ConsumeResult(received=2, new=1, dead_lettered=1, refused=1) == result
    assert (1, "error") == (len(refused), refused[0]["log_level"])
    assert [b"anonymous"] == [d[b"payload"] for d in dead_letters(stream)]
    assert (Counter({"named": 1}), 0) == (effect_counts(app.engine), pending(stream))


def test_what_a_redis_sink_appends_has_its_effect_once_each(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """An outbox sink appends 30 events (drained); the consumer has 30 effects."""
    app = app_on(sqlite_database)
    sink = RedisStreamSink(REDIS_URL, stream=stream)
    app.handler(SinkEvent, name="to_redis", batch_size=10, retry=IMMEDIATE)(sink)
    ids = commit_events(app.engine, event_rows(30))
    drain(app)
    with _consumer(app, stream, Recorder()) as consumer:
        result = consumer.consume(max_messages=30, timeout=5)
    assert ConsumeResult(received=30, new=30) == result
    assert Counter({f"test_sink_events-{i}": 1 for i in ids}) == effect_counts(app.engine)


def test_an_entry_whose_effect_always_times_out_is_dead_lettered_after_the_bound(
    postgres_effects: str,
    app_on: Callable[[str], Outbox],
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An effect that always hits its statement timeout (transient contention): after a few
    whole-batch tries the entries are applied one at a time, the others commit, and the poison
    one is dead-lettered at max_deliveries instead of holding the stream for ever."""
    monkeypatch.setattr(_consumer_module, "BACKOFF_FIRST_SECONDS", 0.01)
    app = app_on(postgres_effects)
    append(stream, ("slow", "times out"), ("fine", "quick"))
    recorder = Recorder()

    def effect(session: Any, messages: list[Any]) -> None:
        if any(m.id == "slow" for m in messages):
            session.execute(text("SET LOCAL statement_timeout = 10"))
            session.execute(text("SELECT pg_sleep(1)"))
        recorder(session, messages)

    with _consumer(app, stream, effect, max_deliveries=2) as consumer:
        result = consumer.consume(max_messages=3, timeout=10)
    assert ConsumeResult(received=3, new=1, failed=1, dead_lettered=1) == result
    assert Counter({"fine": 1}) == effect_counts(app.engine)
    assert [b"slow"] == [fields[b"id"] for fields in dead_letters(stream)]


def test_a_consumer_that_is_never_idle_still_prunes(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """run() with an entry arriving more often than its idle second: ids past their horizon
    are pruned between batches, every prune_interval."""
    app = app_on(sqlite_database)
    brief = Inbox("brief", horizon=0.001)
    with Session(app.engine) as session, session.begin():
        brief.receive(session, "old")
    wait_for(lambda: expired(app.engine, brief), "the id past its horizon")
    consumer = _consumer(app, stream, Recorder(), prune_interval=0.2)
    thread = threading.Thread(target=lambda: consumer.run(handle_signals=False))
    thread.start()
    sent = 0

    def pruned_while_busy() -> bool:
        nonlocal sent
        sent += 1
        append(stream, (f"busy{sent}", "keeps it busy"))
        return ("brief", "old") not in kept_ids(app.engine)

    try:
        wait_for(pruned_while_busy, "a pruning pass while busy", timeout=4)
    finally:
        consumer.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_an_entry_whose_dead_letter_redis_refuses_stays_pending(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """A dead stream key of another type (WRONGTYPE): the entry is not acknowledged, and the
    consumer logs it and goes on rather than raising."""
    app = app_on(sqlite_database)
    with redis.Redis.from_url(REDIS_URL) as client:
        client.set(f"{stream}:dead", "not a stream")
    append(stream, (None, "anonymous"))
    with capture_logs() as logs, _consumer(app, stream, Recorder()) as consumer:
        consumer.consume(max_messages=1, timeout=2)
    assert 1 == pending(stream)
    assert ["error"] == [
        line["log_level"] for line in logs if line["event"] == _log.INBOX_DEAD_LETTER_FAILED
    ]


def test_an_id_that_is_not_utf8_is_refused_like_a_missing_one(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """Two different binary ids are not read as one id (the second a repeat): each is
    dead-lettered as having no id."""
    app = app_on(sqlite_database)
    with redis.Redis.from_url(REDIS_URL) as client:
        for binary_id in (b"\xff", b"\xfe"):
            client.xadd(stream, {b"id": binary_id, b"payload": b"binary"})
    with _consumer(app, stream, Recorder()) as consumer:
        result = consumer.consume(max_messages=2, timeout=2)
    assert ConsumeResult(received=2, dead_lettered=2, refused=2) == result
    assert (Counter(), 2) == (effect_counts(app.engine), len(dead_letters(stream)))


@pytest.mark.parametrize("url", ["http://user:s3cret@127.0.0.1:6379", None])
def test_a_url_that_is_not_redis_is_refused_in_one_line(url: Any) -> None:
    """Refused at construction, naming the argument, not at the first consume()."""
    engine = create_engine("sqlite://")
    with pytest.raises(ConfigurationError, match=r"^url: ") as raised:
        RedisStreamConsumer(engine, Inbox(INBOX), Recorder(), stream="s", group="g", url=url)
    message = str(raised.value)
    assert (False, False) == ("\n" in message, "s3cret" in message)  # one line, no password


def test_a_consumer_whose_stream_was_deleted_makes_its_group_again(
    sqlite_database: str, app_on: Callable[[str], Outbox], stream: str
) -> None:
    """The stream deleted under the consumer (NOGROUP): it says so once, makes the group
    again and consumes what is appended after."""
    app = app_on(sqlite_database)
    with capture_logs() as logs, _consumer(app, stream, Recorder()) as consumer:
        consumer.consume(timeout=0.2)
        with redis.Redis.from_url(REDIS_URL) as client:
            client.delete(stream)
        append(stream, ("after", "appended again"))
        result = consumer.consume(max_messages=1, timeout=3)
    assert ConsumeResult(received=1, new=1) == result
    assert 1 == len([line for line in logs if line["event"] == _log.INBOX_BROKER_ERROR])
