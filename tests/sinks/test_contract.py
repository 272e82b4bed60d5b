"""The contract of every sink, sync and async, on SQLite, PostgreSQL and MariaDB: every
committed event arrives with its values intact and in id order per key, a rolled-back one
never; a downstream that cannot be reached stops the worker at start with one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from structlog.testing import capture_logs

from outbox import (
    Batch,
    DownstreamError,
    DownstreamUnavailableError,
    Outbox,
    RetryPolicy,
    Settings,
    schema,
)
from outbox.ops import replay
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import SinkEvent
from tests.sinks import sink_app
from tests.sinks._contract import (
    SECRET,
    Downstream,
    closed_port,
    commit_events,
    event_id,
    event_rows,
    expected_messages,
    one_line_start_error,
    roll_back_events,
)
from tests.sinks.kinds.http import make_sink

BATCH_SIZE = 40


def test_every_committed_event_arrives_once_intact_and_in_order_per_key(
    downstream: Downstream, sync: bool, database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Committed events arrive once each, values intact, in id order per key; rolled-back
    ones never."""
    app = make_app(database_url, Settings(poll_interval=0.05))
    app.handler(SinkEvent, name="to_sink", batch_size=BATCH_SIZE, ordering_key="account")(
        downstream.sink(sync=sync)
    )
    committed: list[int] = []
    for start in (0, 90, 180):
        committed += commit_events(app.engine, event_rows(90, start))
        roll_back_events(app.engine, event_rows(10, 1000 + start))
    expected = expected_messages(app.engine, committed)

    assert Worker(app, burst=True, concurrency=3).run()

    stored = downstream.stored()
    assert sorted(committed) == sorted(event_id(m.message_id) for m in stored)
    assert expected == {m.message_id: m.values for m in stored}
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for message in stored:
        assert message.key == message.values["account"]
        by_key[message.key].append(event_id(message.message_id))
    assert {key: sorted(ids) for key, ids in by_key.items()} == dict(by_key)


def test_an_event_replayed_from_the_archive_arrives_under_its_own_message_id(
    downstream: Downstream, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Events dead before they were sent, replayed once the downstream is back, arrive under
    the message ids they had, with their values (``created_at`` is the replay's), and an
    event written in between under one of its own: a consumer de-duplicating by message id
    tells a replay from a new event."""
    from tests.conftest import reset_schema

    reset_schema(sqlite_url)
    broken = make_app(sqlite_url)

    @broken.handler(SinkEvent, name="to_sink", retry=RetryPolicy(max_attempts=1))
    def down(batch: Batch[Any]) -> None:
        raise DownstreamError("the downstream is away")

    died = commit_events(broken.engine, event_rows(3))
    expected = expected_messages(broken.engine, died)
    drain(broken)
    fixed = make_app(sqlite_url)
    fixed.handler(SinkEvent, name="to_sink")(downstream.sink(sync=True))
    later = commit_events(fixed.engine, event_rows(1, 100))
    expected |= expected_messages(fixed.engine, later)

    replay.replay(fixed, status="dead")
    drain(fixed)

    assert _but_created_at(expected) == _but_created_at(
        {m.message_id: m.values for m in downstream.stored()}
    )


def _but_created_at(messages: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        message_id: {k: v for k, v in values.items() if k != "created_at"}
        for message_id, values in messages.items()
    }


def test_an_unreachable_downstream_stops_the_worker_at_start_with_one_line(
    downstream: Downstream, sync: bool, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A worker whose sink cannot reach its downstream does not start: one line, no secret."""
    from tests.conftest import reset_schema

    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(SinkEvent, name="to_sink", retry=RetryPolicy(max_attempts=2))(
        downstream.unreachable_sink(sync=sync)
    )
    commit_events(app.engine, event_rows(3))

    message = one_line_start_error(app, DownstreamUnavailableError)

    assert "to_sink" in message


def test_outbox_status_states_the_sinks_guarantee(sqlite_url: str, tmp_path: Path) -> None:
    """``outbox status`` says, for a handler that is a sink, what its delivery guarantees."""
    from tests.conftest import reset_schema

    reset_schema(sqlite_url)
    env = {
        **os.environ,
        sink_app.KIND_ENV: "http",
        sink_app.DESTINATION_ENV: "http://127.0.0.1:9/bulk",
    }
    command = ["--app", "tests.sinks.sink_app:app", "--database-url", sqlite_url, "status"]
    shown = subprocess.run(
        [sys.executable, "-m", "outbox", *command],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout

    guarantee = make_sink("http://127.0.0.1:9/bulk", sync=True).outbox_guarantee
    assert f"to_sink: delivery {guarantee}" in shown.splitlines()


def test_outbox_work_refuses_to_start_in_one_line_when_the_downstream_is_unreachable(
    sqlite_url: str,
) -> None:
    """``outbox work`` with a sink whose API does not answer: exit 3, one line naming the
    handler, before any group is run."""
    from tests.conftest import reset_schema

    reset_schema(sqlite_url)
    unreachable = f"http://127.0.0.1:{closed_port()}/bulk"
    env = {**os.environ, sink_app.KIND_ENV: "http", sink_app.DESTINATION_ENV: unreachable}
    command = ["--app", "tests.sinks.sink_app:app", "--database-url", sqlite_url]
    ran = subprocess.run(
        [sys.executable, "-m", "outbox", *command, "work", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )

    lines = ran.stderr.strip().splitlines()
    assert (3, 1) == (ran.returncode, len(lines))
    assert lines[0].startswith("Error: handler 'to_sink': bulk HTTP API at " + unreachable)


def test_no_secret_shows_where_an_unreachable_downstream_is_recorded(
    downstream: Downstream,
    sync: bool,
    sqlite_url: str,
    make_app: Callable[..., Outbox],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sink with a secret that cannot reach its downstream: neither the error that stops a
    worker at start (with its causes), nor a group's failure (the archive, the attempts), nor
    any log record shows the secret."""
    from tests.conftest import reset_schema

    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    sink = downstream.unreachable_sink(sync=sync)
    app.handler(SinkEvent, name="to_sink", retry=RetryPolicy(max_attempts=1))(sink)
    unstarted = make_app(sqlite_url)
    # The same sink called inside a handler of the user's: connected on first use, by a group.
    if sync:
        unstarted.handler(SinkEvent, name="to_sink", retry=RetryPolicy(max_attempts=1))(
            lambda batch: sink(batch)
        )
    else:

        async def calls_the_sink(batch: Batch[Any]) -> None:
            await sink(batch)

        unstarted.handler(SinkEvent, name="to_sink", retry=RetryPolicy(max_attempts=1))(
            calls_the_sink
        )
    commit_events(app.engine, event_rows(3))
    caplog.set_level(logging.DEBUG)

    with capture_logs() as logs:
        with pytest.raises(DownstreamUnavailableError) as raised:
            Worker(app, burst=True).run()
        Worker(unstarted, burst=True).run()

    with app.engine.connect() as conn:
        archived = conn.execute(select(schema.archive.c.error)).scalars().all()
        attempts = conn.execute(select(schema.attempts.c.error)).scalars().all()
    places = {
        "start error": "".join(traceback.format_exception(raised.value)),
        "archive": " ".join(e or "" for e in archived),
        "attempts": " ".join(e or "" for e in attempts),
        "logs": f"{logs} {caplog.text}",
    }
    assert (3, {}) == (
        len(archived),
        {where: SECRET for where, text in places.items() if SECRET in text},
    )
