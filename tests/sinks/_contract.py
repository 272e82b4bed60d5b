"""The contract every sink keeps, checked the same way against each (``test_contract.py``),
and what the sinks' own tests share to commit events and watch a worker send them.

A sink kind is a :class:`Downstream`: a destination of its own for one test (a stream, a
subject, an exchange and its queue, a fake bulk API), sinks that send there, sync and async,
and a way to read back everything it stored, in the order it stored it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from outbox import Outbox, RetryPolicy, add_events, schema
from outbox.ops import metrics
from outbox.sinks.encoding import json_payload
from outbox.worker import Worker
from tests.models import SinkEvent

ACCOUNTS = ("acme", "globex", "initech", "umbrella", "hooli")

IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)
# Failed groups come back quickly, many times: an outage of a few seconds never dead-letters.
PATIENT = RetryPolicy(max_attempts=1000, scale=0.0, base_delay=0.2, jitter=0.0)
OUTAGE_SECONDS = 60.0
"""The longest a test waits for a downstream taken away to be back, and drained."""


@dataclass(frozen=True, slots=True)
class Stored:
    """One message as the downstream stored it."""

    message_id: str
    key: str | None
    values: dict[str, Any]
    """The body, decoded (the default payload: the event's columns as JSON)."""


class Downstream(Protocol):
    """A destination made for one test, and the sinks that send there."""

    name: str

    def sink(self, *, sync: bool) -> Any:
        """A sink sending here: the sync class (``sync=True``) or the async one."""

    def unreachable_sink(self, *, sync: bool) -> Any:
        """A sink configured with a secret, pointed at a port nothing listens on."""

    def stored(self) -> list[Stored]:
        """Everything stored here, in the order the downstream stored it."""


class NamedDownstream:
    """A :class:`Downstream` known by its name alone (a stream, an exchange and its queue): a
    kind gives, as ``make`` and ``read``, its functions that make a sink sending to a name and
    read what a name stored (an application in a subprocess sends where a test reads)."""

    make: Callable[..., Any]
    read: Callable[[str], list[Stored]]

    def __init__(self, name: str) -> None:
        self.name = name

    def sink(self, *, sync: bool, **options: Any) -> Any:
        """A sink sending here (``options`` override its arguments)."""
        return self.make(self.name, sync=sync, **options)

    def stored(self) -> list[Stored]:
        """Everything stored here, in the order the downstream stored it."""
        return self.read(self.name)


SECRET = "s3cret-p4ss"
"""The password or token an unreachable sink is configured with: no message may show it."""


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def require_service(what: str, host: str, port: int) -> None:
    """Skip when nothing answers at ``host:port``; fail instead when ``CI=true``."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as error:
        message = f"{what} is not reachable at {host}:{port}: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: broker tests must not skip)", pytrace=False)
        pytest.skip(message)


def event_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    """``count`` events over the accounts, with values of every column type the model has."""
    return [
        {
            "account": ACCOUNTS[(start + n) % len(ACCOUNTS)],
            "amount": Decimal(f"{start + n}.{n % 100:02d}"),
            "note": None if n % 7 == 0 else f"caf\u00e9 \u2615 #{start + n}",
            "data": None if n % 5 == 0 else {"n": start + n, "tags": ["a", "b"], "ok": True},
            "ref": uuid.uuid4(),
        }
        for n in range(count)
    ]


def commit_events(engine: Engine, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Commit ``rows`` as SinkEvents in one transaction; their ids."""
    with engine.begin() as conn:
        before = conn.execute(select(func.coalesce(func.max(SinkEvent.id), 0))).scalar_one()
        add_events(conn, SinkEvent, rows)
        ids = conn.execute(select(SinkEvent.id).where(SinkEvent.id > before).order_by(SinkEvent.id))
        return list(ids.scalars())


def roll_back_events(engine: Engine, rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` in a transaction that rolls back."""
    with engine.connect() as conn:
        add_events(conn, SinkEvent, rows)
        conn.rollback()


def expected_messages(engine: Engine, ids: Iterable[int]) -> dict[str, dict[str, Any]]:
    """The default payload of each event, decoded, by default message id, read before the
    events are sent (sending deletes them)."""
    wanted = set(ids)
    with Session(engine) as session:
        events = session.scalars(select(SinkEvent).order_by(SinkEvent.id)).all()
        return {
            f"{SinkEvent.__tablename__}-{e.id}": json.loads(json_payload(e))
            for e in events
            if e.id in wanted
        }


def event_id(message_id: str) -> int:
    """The event id in a default message id (``test_sink_events-42``)."""
    return int(message_id.rsplit("-", 1)[1])


def waiting_events(engine: Engine) -> list[SinkEvent]:
    """The waiting events, detached, in id order."""
    with Session(engine) as session:
        events = list(session.scalars(select(SinkEvent).order_by(SinkEvent.id)))
        session.expunge_all()
    return events


def waiting_rows(engine: Engine) -> list[Any]:
    """The waiting events as rows, in id order, as a worker hands a group over."""
    with engine.connect() as conn:
        return list(conn.execute(select(SinkEvent.__table__).order_by(SinkEvent.id)))


def buffer_empty(engine: Engine) -> bool:
    """Whether no event waits."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(SinkEvent)).scalar_one() == 0


def archived(engine: Engine) -> dict[int, tuple[str, str | None]]:
    """Each archived event's status and error, by event id."""
    archive = schema.archive
    with engine.connect() as conn:
        rows = conn.execute(select(archive.c.event_id, archive.c.status, archive.c.error))
        return {event: (status, error) for event, status, error in rows}


def breaker_state(app: Outbox) -> str | None:
    """The circuit breaker's state of the application's one handler."""
    (status,) = metrics.collect(app)
    return status.breaker


def one_line_start_error(app: Outbox, error: type[Exception]) -> str:
    """What stops a burst worker of ``app`` at start, as ``error``: one line, no secret."""
    with pytest.raises(error) as raised:
        Worker(app, burst=True).run()
    message = str(raised.value)
    assert "\n" not in message
    assert SECRET not in message
    assert SECRET not in "".join(traceback.format_exception(raised.value))  # nor its causes
    return message


class Running:
    """A worker in a thread, stopped at the end."""

    def __init__(self, app: Outbox, concurrency: int = 2) -> None:
        self.worker = Worker(app, concurrency=concurrency)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(30)
