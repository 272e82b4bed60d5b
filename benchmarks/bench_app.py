"""The application the throughput benchmarks drain: one buffer, a no-op handler.

Steered by the environment: ``BENCH_BATCH_SIZE`` (default 1000), ``BENCH_ARCHIVE`` (1: archive
succeeded groups), ``BENCH_MAX_BATCHES`` (default 64), ``BENCH_TYPED`` (``events`` or
``rows``: drain the typed buffer instead, whose columns are an Enum, JSON, a DateTime with
time zone, a Numeric and a String, with a handler that reads every value of every event
through ``batch.events`` or through ``batch.rows``), ``BENCH_RATE_LIMIT`` (calls per second:
a rate limit on the handler; none by default), ``BENCH_CONCURRENCY`` (the most groups in flight
fleet-wide; no cap by default), ``BENCH_BREAKER`` (failures in a row: a circuit breaker on the
handler; none by default).
"""

from __future__ import annotations

import datetime as dt
import enum
import os
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy import JSON, DateTime, Enum, Numeric, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, CircuitBreaker, Outbox, RateLimit, Urgency


class Base(DeclarativeBase):
    pass


class BenchEvent(BufferMixin, Base):
    __tablename__ = "bench_events"
    account_id: Mapped[int]
    kind: Mapped[str] = mapped_column(String(32))


class Channel(enum.StrEnum):
    EMAIL = "email"
    SMS = "sms"
    PUSH = "push"


class TypedBenchEvent(BufferMixin, Base):
    """A buffer whose columns each need typing: what applying column types costs."""

    __tablename__ = "bench_typed_events"
    channel: Mapped[Channel] = mapped_column(Enum(Channel, name="bench_channel"))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    account: Mapped[str] = mapped_column(String(64))


class JsonBenchEvent(BufferMixin, Base):
    """A buffer of JSON documents: the common outbox event, a payload and nothing else."""

    __tablename__ = "bench_json_events"
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


def bulk_body(events: Iterable[Any]) -> tuple[list[tuple[Any, ...]], Decimal]:
    """What a handler building one bulk request does with a group: every typed value of every
    event read once, collected into the request's body, the amounts summed (the channel goes
    in as it is: a ``StrEnum`` member is a ``str``)."""
    body = []
    total = Decimal(0)
    for event in events:
        body.append(
            (
                event.id,
                event.channel,
                event.payload["page"],
                event.occurred_at.isoformat(),
                event.account,
            )
        )
        total += event.amount
    return body, total


app = Outbox()
SETTINGS: dict[str, Any] = {
    "batch_size": int(os.environ.get("BENCH_BATCH_SIZE", "1000")),
    "urgency": Urgency.HOUR,
    "archive": os.environ.get("BENCH_ARCHIVE") == "1",
    "max_batches": int(os.environ.get("BENCH_MAX_BATCHES", "64")),
}
if os.environ.get("BENCH_RATE_LIMIT"):
    SETTINGS["rate_limit"] = RateLimit(calls=int(os.environ["BENCH_RATE_LIMIT"]), per=1)
if os.environ.get("BENCH_CONCURRENCY"):
    SETTINGS["concurrency"] = int(os.environ["BENCH_CONCURRENCY"])
if os.environ.get("BENCH_BREAKER"):
    SETTINGS["circuit_breaker"] = CircuitBreaker(failures=int(os.environ["BENCH_BREAKER"]))
TYPED = os.environ.get("BENCH_TYPED", "")
if TYPED not in ("", "events", "rows", "json"):
    raise ValueError(f"BENCH_TYPED must be events, rows or json, got {TYPED!r}")


if not TYPED:

    @app.handler(BenchEvent, **SETTINGS)
    def noop(batch: Batch[BenchEvent]) -> None:
        """Accept every event."""

elif TYPED == "json":

    @app.handler(JsonBenchEvent, **SETTINGS)
    def pages(batch: Batch[JsonBenchEvent]) -> None:
        """Read one value of every event's document, as a bulk request's body would."""
        [(event.id, event.payload["page"]) for event in batch.events]

else:

    @app.handler(TypedBenchEvent, **SETTINGS)
    def typed(batch: Batch[TypedBenchEvent]) -> None:
        """Read every typed value of every event, as ``BENCH_TYPED`` says: ``batch.events``
        (model instances) or ``batch.rows`` (``Row`` tuples)."""
        events: Sequence[Any] = batch.events if TYPED == "events" else batch.rows
        bulk_body(events)
