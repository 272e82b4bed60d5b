"""The NATS JetStream sink, sync and async: the stream's duplicate window is checked against the
handler's re-send horizon at start; a re-sent message is stored once; what the stream did not
acknowledge, and only that, is retried; a server killed mid-drain and started again loses
nothing and stores no duplicate, while the circuit breaker opens and closes; bad configuration
stops the worker in one line, with no secret."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from outbox import (
    Batch,
    CircuitBreaker,
    ConfigurationError,
    DownstreamError,
    DownstreamUnavailableError,
    Outbox,
    RetryPolicy,
)
from outbox.sinks.dedup_window import resend_horizon
from outbox.sinks.nats import AsyncJetStreamSink, JetStreamSink, check_window
from outbox.testing import drain
from tests._support import wait_for
from tests.conftest import reset_schema
from tests.models import SinkEvent
from tests.sinks import sink_app
from tests.sinks._contract import (
    IMMEDIATE,
    OUTAGE_SECONDS,
    PATIENT,
    SECRET,
    Running,
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
from tests.sinks.kinds.nats import (
    NATS_URL,
    JetStreamDownstream,
    PrivateServer,
    create,
    delete,
    destination,
    read,
    read_stored,
    unique_name,
)


def _send(sink: Any, sync: bool, *batches: Callable[[], Batch[Any]]) -> None:
    """Call ``sink`` with each batch in turn (each made when its turn comes), then close it."""
    if sync:
        for make in batches:
            sink(make())
        sink.close()
        return

    async def run() -> None:
        for make in batches:
            await sink(make())
        await sink.outbox_stop()

    asyncio.run(run())


def test_the_window_check_refuses_a_handler_that_may_resend_after_the_window(
    sync: bool, app: Outbox
) -> None:
    """A stream whose duplicate window is shorter than the handler's re-send horizon stops
    the worker at start, in one line naming both."""
    with destination(duplicate_window=60.0) as downstream_name:
        downstream = JetStreamDownstream(downstream_name)
        app.handler(SinkEvent, name="to_nats")(downstream.sink(sync=sync))
        horizon = resend_horizon(app, app.get_handler("to_nats"))
        commit_events(app.engine, event_rows(3))

        message = one_line_start_error(app, ConfigurationError)

    assert message == (
        f"handler 'to_nats': JetStream stream '{downstream.name}' drops a re-sent message "
        f"within 60 s, but an event may be re-sent up to {horizon:.0f} s after it was first "
        f"sent (every retry wait, and the lease and timeout of each attempt before the last): "
        f"raise the window to at least {horizon:.0f} s, or lower RetryPolicy.max_attempts or "
        f"max_delay, or the lease"
    )


def test_the_window_check_accepts_a_handler_within_the_window_and_states_it(
    sync: bool, app: Outbox
) -> None:
    """A handler whose re-send horizon is within the window runs; the guarantee names the
    stream, the window and the horizon."""
    retry = RetryPolicy(max_delay=30.0)
    with destination(duplicate_window=300.0) as downstream_name:
        downstream = JetStreamDownstream(downstream_name)
        sink = downstream.sink(sync=sync)
        app.handler(SinkEvent, name="to_nats", retry=retry)(sink)
        horizon = resend_horizon(app, app.get_handler("to_nats"))
        before = sink.outbox_guarantee
        committed = commit_events(app.engine, event_rows(5))

        drain(app)

        assert committed == [event_id(m.message_id) for m in downstream.stored()]
    assert "checked at worker start" in before
    assert sink.outbox_guarantee == (
        f"at least once; no duplicates stored on JetStream stream '{downstream.name}' within "
        f"its duplicate window (300 s, at least the handler's re-send horizon of "
        f"{horizon:.0f} s, checked at start); past it, consumers de-duplicate by the "
        f"Nats-Msg-Id header"
    )


def test_a_stream_without_a_duplicate_window_is_refused(app: Outbox) -> None:
    """A duplicate window of 0 (no de-duplication) is refused in one line, naming the
    window the handler needs."""
    app.handler(SinkEvent, name="to_nats")(lambda batch: None)
    handler = app.get_handler("to_nats")

    with pytest.raises(ConfigurationError) as raised:
        check_window(app, handler, "ORDERS", 0.0)

    assert str(raised.value) == (
        f"handler 'to_nats': JetStream stream 'ORDERS' has no duplicate window "
        f"(duplicate_window 0), so a re-sent message would be stored twice: give it a "
        f"duplicate_window of at least {resend_horizon(app, handler):.0f} s (every retry "
        f"wait, and the lease and timeout of each attempt before the last)"
    )


def test_an_attempt_repeated_after_its_messages_were_stored_stores_them_once(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """An attempt that failed after the stream stored its messages (its acknowledgement lost,
    say) sends them again: the stream drops the re-sent ones and the retry succeeds."""
    sink = nats_downstream.sink(sync=sync)
    if sync:

        def handler(batch: Batch[SinkEvent]) -> None:
            sink(batch)
            if batch.attempt == 1:
                raise DownstreamError("the acknowledgement was lost")

    else:

        async def handler(batch: Batch[SinkEvent]) -> None:  # type: ignore[misc]
            await sink(batch)
            if batch.attempt == 1:
                raise DownstreamError("the acknowledgement was lost")

    app.handler(SinkEvent, name="to_nats", batch_size=50, retry=IMMEDIATE, archive=True)(handler)
    committed = commit_events(app.engine, event_rows(30))

    drain(app)

    assert committed == [event_id(m.message_id) for m in nats_downstream.stored()]
    assert {i: "succeeded" for i in committed} == {
        i: status for i, (status, _) in archived(app.engine).items()
    }


def test_the_same_group_sent_twice_is_stored_once(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """A group sent twice: the second time every message is a duplicate the stream drops,
    and acknowledges, so nothing is retried."""
    commit_events(app.engine, event_rows(20))
    events = waiting_events(app.engine)
    batches = [Batch(events, group_id=uuid.uuid4(), attempt=n, handler="h") for n in (1, 2)]

    _send(nats_downstream.sink(sync=sync), sync, *(lambda b=b: b for b in batches))

    assert [e.id for e in events] == [event_id(m.message_id) for m in nats_downstream.stored()]
    assert [{}, {}] == [b.retried_ids for b in batches]


def test_a_partial_failure_retries_only_what_was_not_acknowledged(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """Messages on a subject no stream listens on are not acknowledged: only those are
    retried, with the reason, and sending them again once the stream listens stores each
    event once."""
    name = nats_downstream.name
    elsewhere = f"{name}-elsewhere"
    sink = nats_downstream.sink(
        sync=sync,
        subject=lambda e: f"{elsewhere}.{e.account}" if e.account == "hooli" else f"{name}.x",
    )
    ids = commit_events(app.engine, event_rows(20))
    hooli = ids[4::5]  # event_rows gives every fifth event to hooli
    events = waiting_events(app.engine)
    first = Batch(events, group_id=uuid.uuid4(), attempt=1, handler="to_nats")

    def retried() -> Batch[Any]:
        asyncio.run(_listen_also(name, f"{elsewhere}.>"))
        again = [e for e in events if e.id in first.retried_ids]
        return Batch(again, group_id=uuid.uuid4(), attempt=2, handler="to_nats")

    if sync:
        _send(sink, sync, lambda: first, retried)
    else:
        # The stream is changed from a thread of its own: asyncio.run cannot nest.
        async def both() -> None:
            await sink(first)
            await sink(await asyncio.to_thread(retried))
            await sink.outbox_stop()

        asyncio.run(both())

    assert hooli == sorted(first.retried_ids)
    assert {f"no JetStream stream listens on subject '{elsewhere}.hooli' (no responders)"} == set(
        first.retried_ids.values()
    )
    stored = [event_id(m.message_id) for m in nats_downstream.stored()]
    assert [i for i in ids if i not in hooli] + hooli == stored


def test_a_message_for_another_stream_is_refused_there_and_retried(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """A message whose subject another stream listens on is refused with JetStream's reason
    (it expects the sink's stream) and retried, never stored outside the checked window."""
    with destination() as other_name:
        other = JetStreamDownstream(other_name)
        sink = nats_downstream.sink(
            sync=sync,
            subject=lambda e: (
                f"{other.name}.x" if e.account == "hooli" else f"{nats_downstream.name}.x"
            ),
        )
        ids = commit_events(app.engine, event_rows(10))
        hooli = ids[4::5]
        first = Batch(
            waiting_events(app.engine), group_id=uuid.uuid4(), attempt=1, handler="to_nats"
        )

        _send(sink, sync, lambda: first)

        assert [] == other.stored()
    assert [i for i in ids if i not in hooli] == [
        event_id(m.message_id) for m in nats_downstream.stored()
    ]
    assert {
        "refused by JetStream: expected stream does not match (code 400, err_code 10060)"
    } == set(first.retried_ids.values())
    assert hooli == sorted(first.retried_ids)


async def _listen_also(stream: str, subject: str) -> None:
    client = await nats.connect(NATS_URL, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        config: StreamConfig = (await jetstream.stream_info(stream)).config
        await jetstream.update_stream(config.evolve(subjects=[*(config.subjects or []), subject]))
    finally:
        await client.close()


def test_a_group_of_one_key_is_stored_in_id_order(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """A group of 1,000 events of one key, written pipelined, is stored in id order."""
    app.handler(SinkEvent, name="to_nats", batch_size=1000, ordering_key="account")(
        nats_downstream.sink(sync=sync)
    )
    committed = commit_events(app.engine, [{**row, "account": "acme"} for row in event_rows(1000)])

    drain(app)

    stored = nats_downstream.stored()
    assert committed == [event_id(m.message_id) for m in stored]
    assert {"acme"} == {m.key for m in stored}


def _start_and_send(sink: Any, sync: bool, app: Outbox, batch: Batch[Any]) -> None:
    """Start ``sink`` as ``batch``'s handler, as a worker does (it learns the handler there),
    send ``batch``, then close the sink."""
    handler = app.get_handler(batch.handler)
    if sync:
        sink.outbox_start(app, handler)
        sink(batch)
        sink.close()
        return

    async def run() -> None:
        await sink.outbox_start(app, handler)
        await sink(batch)
        await sink.outbox_stop()

    asyncio.run(run())


async def _raw_stored(stream: str) -> list[tuple[str | None, str | None, bytes | None]]:
    """Every message ``stream`` holds, as stored: its subject, its header block (base64) and
    its body."""
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        count = (await jetstream.stream_info(stream)).state.messages
        messages = [await jetstream.get_msg(stream, seq) for seq in range(1, count + 1)]
        return [(m.subject, m.hdrs, m.data) for m in messages]
    finally:
        await client.close()


def test_a_group_read_from_its_rows_stores_the_messages_its_events_would(app: Outbox) -> None:
    """The default messages of a group handed over as rows (as a worker does) are stored,
    byte for byte (subject, headers, body), as those of the same group handed over as
    events."""
    with destination() as name:
        sink = JetStreamSink(NATS_URL, subject=f"{name}.orders", stream=name)
        app.handler(SinkEvent, name="to_nats", ordering_key="account")(sink)
        sink.outbox_start(app, app.get_handler("to_nats"))
        ids = commit_events(app.engine, event_rows(30))
        rows = waiting_rows(app.engine)

        sink(Batch(rows=rows, model=SinkEvent, group_id=uuid.uuid4(), attempt=1, handler="to_nats"))
        from_rows = asyncio.run(_raw_stored(name))
        # The same stream again, empty, with no message id to drop.
        asyncio.run(delete(name))
        asyncio.run(create(name))
        sink(Batch(waiting_events(app.engine), group_id=uuid.uuid4(), attempt=1, handler="to_nats"))
        from_events = asyncio.run(_raw_stored(name))
        sink.close()

    assert len(ids) == len(from_events)
    assert from_events == from_rows


def test_a_group_read_from_its_rows_retries_only_what_the_stream_refused(
    sync: bool, app: Outbox
) -> None:
    """A group handed over as rows, of which the stream takes only the first messages (a
    limit of 5 messages that refuses new ones): the others, and only they, are retried, with
    JetStream's reason."""
    with destination(max_msgs=5, discard=DiscardPolicy.NEW) as name:
        sink_class = JetStreamSink if sync else AsyncJetStreamSink
        sink = sink_class(NATS_URL, subject=f"{name}.orders", stream=name)
        app.handler(SinkEvent, name="to_nats")(sink)
        ids = commit_events(app.engine, event_rows(8))
        batch = Batch(
            rows=waiting_rows(app.engine),
            model=SinkEvent,
            group_id=uuid.uuid4(),
            attempt=1,
            handler="to_nats",
        )

        _start_and_send(sink, sync, app, batch)

        stored = read_stored(name)
    assert ids[:5] == [event_id(m.message_id) for m in stored]
    assert ids[5:] == sorted(batch.retried_ids)
    assert {"refused by JetStream: maximum messages exceeded (code 503, err_code 10077)"} == set(
        batch.retried_ids.values()
    )


def test_the_server_killed_mid_drain_loses_nothing_and_stores_no_duplicate(
    sync: bool, app: Outbox, tmp_path: Path
) -> None:
    """The server killed while the worker drains, then started again: the breaker opens while
    it is away and closes after; every committed event is stored exactly once."""
    name, batch_size = unique_name(), 500
    sink_class = JetStreamSink if sync else AsyncJetStreamSink
    with PrivateServer(tmp_path / "jetstream") as server:
        asyncio.run(create(name, server.url))
        app.handler(
            SinkEvent,
            name="to_nats",
            batch_size=batch_size,
            retry=PATIENT,
            circuit_breaker=CircuitBreaker(failures=2, probe_after=1, max_probe_after=2),
        )(sink_class(server.url, subject=f"{name}.events", ack_timeout=2.0))
        committed = commit_events(app.engine, event_rows(3000))
        expected = expected_messages(app.engine, committed)

        with Running(app):
            asyncio.run(_kill_when_stored(server, name, batch_size * 2 + batch_size // 2))
            _wait(lambda: breaker_state(app) == "open", "the breaker open")
            server.start()
            _wait(lambda: buffer_empty(app.engine), "the buffer drained")
            _wait(lambda: breaker_state(app) == "closed", "the breaker closed")

        stored = asyncio.run(read(name, server.url))

    assert sorted(committed) == sorted(event_id(m.message_id) for m in stored)
    duplicates = [i for i, n in Counter(m.message_id for m in stored).items() if n > 1]
    assert [] == duplicates
    assert expected == {m.message_id: m.values for m in stored}


def test_the_duplicate_window_outlives_a_server_restart(
    sync: bool, app: Outbox, tmp_path: Path
) -> None:
    """A group stored, the server killed and started again, the same group sent again (its
    acknowledgement lost with the server, say): the stream holds each message once."""
    name = unique_name()
    commit_events(app.engine, event_rows(50))
    events = waiting_events(app.engine)
    batches = [Batch(events, group_id=uuid.uuid4(), attempt=n, handler="h") for n in (1, 2)]
    sink_class = JetStreamSink if sync else AsyncJetStreamSink
    with PrivateServer(tmp_path / "jetstream") as server:
        asyncio.run(create(name, server.url))
        _send(sink_class(server.url, subject=f"{name}.x"), sync, lambda: batches[0])
        server.kill()
        server.start()
        _send(sink_class(server.url, subject=f"{name}.x"), sync, lambda: batches[1])
        stored = asyncio.run(read(name, server.url))

    assert [e.id for e in events] == [event_id(m.message_id) for m in stored]
    assert [{}, {}] == [b.retried_ids for b in batches]


async def _kill_when_stored(server: PrivateServer, stream: str, count: int) -> None:
    """Kill ``server`` once ``stream`` holds ``count`` messages."""
    client = await nats.connect(server.url, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        async with asyncio.timeout(OUTAGE_SECONDS):
            while (await jetstream.stream_info(stream)).state.messages < count:
                await asyncio.sleep(0.005)
        server.kill()
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _stored_count(servers: str, stream: str) -> int:
    client = await nats.connect(servers, allow_reconnect=False)
    try:
        return (await client.jetstream().stream_info(stream)).state.messages
    finally:
        await client.close()


def _wait(condition: Callable[[], object], what: str) -> None:
    wait_for(condition, what, OUTAGE_SECONDS)


def test_an_unknown_stream_stops_the_worker_at_start_with_one_line(sync: bool, app: Outbox) -> None:
    """A sink naming a stream that does not exist stops the worker: one line naming it."""
    missing = f"outbox-test-missing-{uuid.uuid4().hex[:8]}"
    sink_class = JetStreamSink if sync else AsyncJetStreamSink
    app.handler(SinkEvent, name="to_nats")(
        sink_class(NATS_URL, subject=lambda e: f"{missing}.x", stream=missing)
    )
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, ConfigurationError)

    assert message == (
        f"handler 'to_nats': NATS JetStream at {NATS_URL}: no JetStream stream '{missing}' "
        f"(create it first, or name one that exists)"
    )


def test_a_subject_no_stream_listens_on_stops_the_worker_at_start_with_one_line(
    sync: bool, app: Outbox
) -> None:
    """A sink whose subject no stream listens on stops the worker: one line naming it."""
    subject = f"outbox-test-nowhere-{uuid.uuid4().hex[:8]}.events"
    sink_class = JetStreamSink if sync else AsyncJetStreamSink
    app.handler(SinkEvent, name="to_nats")(sink_class(NATS_URL, subject=subject))
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, ConfigurationError)

    assert message == (
        f"handler 'to_nats': NATS JetStream at {NATS_URL}: no JetStream stream listens on "
        f"subject '{subject}' (add it to a stream's subjects)"
    )


def test_a_subject_of_another_stream_stops_the_worker_at_start_with_one_line(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """A sink whose subject belongs to another stream than the one it names stops the
    worker: one line naming both."""
    with destination() as other_name:
        other = JetStreamDownstream(other_name)
        app.handler(SinkEvent, name="to_nats")(
            nats_downstream.sink(sync=sync, subject=f"{other.name}.events")
        )
        commit_events(app.engine, event_rows(3))

        message = one_line_start_error(app, ConfigurationError)

    assert message.endswith(
        f"subject '{other.name}.events' belongs to JetStream stream '{other.name}', not "
        f"'{nats_downstream.name}'"
    )


def test_wrong_credentials_stop_the_worker_at_start_with_one_line_and_no_secret(
    sync: bool, app: Outbox, tmp_path: Path
) -> None:
    """A password the server refuses stops the worker: one line, the password masked."""
    with PrivateServer(tmp_path / "jetstream", user="outbox", password="right-password") as server:
        sink_class = JetStreamSink if sync else AsyncJetStreamSink
        url = f"nats://outbox:{SECRET}@127.0.0.1:{server.port}"
        app.handler(SinkEvent, name="to_nats")(sink_class(url, subject="orders.events"))
        commit_events(app.engine, event_rows(3))

        message = one_line_start_error(app, DownstreamUnavailableError)

    assert message == (
        f"handler 'to_nats': NATS JetStream at nats://127.0.0.1:{server.port}: "
        f"Error: nats: 'Authorization Violation'"
    )


def test_an_unreachable_server_stops_the_worker_at_start_with_one_line(
    nats_downstream: JetStreamDownstream, sync: bool, app: Outbox
) -> None:
    """A server nothing answers for stops the worker quickly: one line, no secret."""
    app.handler(SinkEvent, name="to_nats")(nats_downstream.unreachable_sink(sync=sync))
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, DownstreamUnavailableError)

    assert message.startswith("handler 'to_nats': NATS JetStream at nats://127.0.0.1:")
    assert "ConnectionRefusedError" in message


def test_the_sink_names_its_servers_without_credentials() -> None:
    """``downstream`` shows no password or token, from the URL or the options."""
    sink = AsyncJetStreamSink(
        [f"nats://app:{SECRET}@nats-1.internal", f"tls://{SECRET}@nats-2.internal:4443"],
        subject="orders",
        connect_options={"token": SECRET},
    )

    assert "NATS JetStream at nats://nats-1.internal:4222, tls://nats-2.internal:4443" == (
        sink.downstream
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"servers": "http://127.0.0.1:4222"}, "servers"),
        ({"servers": []}, "servers"),
        ({"ack_timeout": 0}, "ack_timeout"),
        ({"subject": 42}, "subject"),
        ({"subject": "orders.*"}, "subject"),
        ({"subject": lambda event: "orders"}, "subject"),
        ({"stream": "ORDERS.EU"}, "stream"),
    ],
)
def test_a_wrong_argument_is_refused_naming_it(options: dict[str, Any], field: str) -> None:
    """A wrong constructor argument raises ConfigurationError naming the argument; a subject
    function without ``stream=`` among them."""
    arguments: dict[str, Any] = {"subject": "orders", **options}

    with pytest.raises(ConfigurationError, match=f"^{field}: "):
        AsyncJetStreamSink(**arguments)


APP = "tests.sinks.sink_app:app"


def _outbox(database_url: str, stream: str, *command: str) -> subprocess.CompletedProcess[str]:
    """The real ``outbox`` command on ``tests.sinks.sink_app``, its handler ``to_sink`` a
    JetStream sink publishing to ``stream``."""
    env = {**os.environ, sink_app.KIND_ENV: "nats", sink_app.DESTINATION_ENV: stream}
    return subprocess.run(
        [sys.executable, "-m", "outbox", "--app", APP, "--database-url", database_url, *command],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )


def _sink_app_horizon() -> float:
    """The re-send horizon of ``sink_app``'s handler."""
    app = Outbox(settings=sink_app.SETTINGS)
    app.handler(SinkEvent, name="to_sink", retry=sink_app.RETRY)(print)
    return resend_horizon(app, app.get_handler("to_sink"))


def test_outbox_check_fails_naming_the_handler_for_a_window_the_worker_refuses(
    sqlite_url: str,
) -> None:
    """``outbox check`` runs the worker's start check: a stream whose duplicate window is
    shorter than the handler's re-send horizon exits 1 with one line naming the handler, the
    line ``outbox work`` refuses to start with (exit 2, a configuration error); ``outbox
    status`` shows it."""
    reset_schema(sqlite_url)
    with destination(duplicate_window=5.0) as stream:
        checked = _outbox(sqlite_url, stream, "check")
        shown = _outbox(sqlite_url, stream, "status")
        worked = _outbox(sqlite_url, stream, "work", "--burst")

    refusal = worked.stderr.strip().removeprefix("Error: ")
    assert (1, f"alert: {refusal}", 2) == (
        checked.returncode,
        checked.stdout.strip(),
        worked.returncode,
    )
    status_line = f"to_sink: a worker refuses to start: {refusal.split(': ', 1)[1]}"
    assert (0, True) == (shown.returncode, status_line in shown.stdout.splitlines())
    assert refusal.startswith(f"handler 'to_sink': JetStream stream '{stream}' drops a re-sent")


def test_outbox_status_shows_the_duplicate_window_the_sink_checked(sqlite_url: str) -> None:
    """``outbox status``, text and ``--json``, states the stream's duplicate window and the
    handler's re-send horizon it was checked against, as a worker's start check reads them;
    ``outbox check`` passes."""
    reset_schema(sqlite_url)
    with destination(duplicate_window=300.0) as stream:
        text = _outbox(sqlite_url, stream, "status")
        document = _outbox(sqlite_url, stream, "status", "--json")
        checked = _outbox(sqlite_url, stream, "check")

    guarantee = (
        f"at least once; no duplicates stored on JetStream stream '{stream}' within its "
        f"duplicate window (300 s, at least the handler's re-send horizon of "
        f"{_sink_app_horizon():.0f} s, checked at start); past it, consumers de-duplicate by "
        f"the Nats-Msg-Id header"
    )
    (row,) = json.loads(document.stdout)["handlers"]
    assert (0, True, guarantee, None) == (
        text.returncode,
        f"to_sink: delivery {guarantee}" in text.stdout.splitlines(),
        row["guarantee"],
        row["refused_at_start"],
    )
    assert (0, "all promises hold") == (checked.returncode, checked.stdout.strip())
