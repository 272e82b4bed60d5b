"""100,000 events through a rate-limited bulk API by four worker processes: every good event
delivered once, rejected records discarded, poison records dead alone, no dead letter from a
429, no second in which the handler started more calls than its limit, and none in which the
API (a process of its own, as a real one is) saw more calls than its own. Real ``outbox work``
processes, on PostgreSQL and MariaDB."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, select

from examples.marketing_sync.fake_api import FakeMarketingAPIProcess, most_in_a_second
from outbox import add_events, schema
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import LEASE, Cli
from tests.acceptance.bulk_app import CALLS_PER_SECOND_ENV, STARTS_ENV, URL_ENV
from tests.models import ActivityEvent

EVENTS = 100_000
API_CALLS_PER_SECOND = 20
HANDLER_CALLS_PER_SECOND = 18
NO_EMAIL_EVERY = 97
POISON = {12_345, 55_555, 98_765}
DRAIN_SECONDS = 240.0


def _kind(n: int) -> str:
    if n in POISON:
        return "poison"
    return "no_email" if n % NO_EMAIL_EVERY == 0 else "viewed"


def test_a_hundred_thousand_events_through_a_rate_limited_bulk_api(
    cli: Cli, server_database: str, connect: Callable[[str], Engine], tmp_path: Path
) -> None:
    engine = connect(server_database)
    with engine.begin() as conn:
        add_events(
            conn, ActivityEvent, [{"activity_id": n, "kind": _kind(n)} for n in range(EVENTS)]
        )
        kinds = dict(conn.execute(select(ActivityEvent.id, ActivityEvent.kind)).all())
    with FakeMarketingAPIProcess(rate_limit=API_CALLS_PER_SECOND, max_records=1000) as api:
        starts = tmp_path / "starts.log"
        env = {
            URL_ENV: api.url,
            CALLS_PER_SECOND_ENV: str(HANDLER_CALLS_PER_SECOND),
            STARTS_ENV: str(starts),
        }
        app = "tests.acceptance.bulk_app:app"
        base = ("--app", app, "--database-url", server_database)
        work = cli.start(*base, "work", *LEASE, "--processes", "4", "--distribute-every", "0.5",
                         env=env)  # fmt: skip

        wait_for(
            lambda: _tables.buffer_is_empty(engine), "the buffer to drain", timeout=DRAIN_SECONDS
        )
        work.send(signal.SIGTERM)
        stopped = work.wait(60)
        received, rejected, calls = api.received, api.rejected, api.calls
        most = api.most_calls_in_a_second()
    started = most_in_a_second(float(line) for line in starts.read_text().split())
    with engine.connect() as conn:
        archived = Counter(
            (status, kinds[event_id])
            for status, event_id in conn.execute(
                select(schema.archive.c.status, schema.archive.c.event_id)
            )
        )
    good = {str(i) for i, kind in kinds.items() if kind == "viewed"}
    no_email = sum(1 for kind in kinds.values() if kind == "no_email")
    assert (0, good, []) == (stopped, set(received), [i for i, n in received.items() if n > 1])
    assert {("dead", "poison"): len(POISON), ("discarded", "no_email"): no_email} == dict(archived)
    assert (no_email, True, True) == (
        len(rejected),
        started <= HANDLER_CALLS_PER_SECOND,
        most <= API_CALLS_PER_SECOND,
    ), (started, most, len(calls))
