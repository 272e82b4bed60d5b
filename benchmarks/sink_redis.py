"""The Redis Streams sink against a raw redis-py loop publishing the same messages, in one run.

``--events`` events (an account, an amount, a note, a JSON document) wait in a buffer on
PostgreSQL, in a scratch database of the benchmark's own. Each run, in this order:

- **raw, payloads ready**: the messages the sink sends (the same ``id`` and ``payload``
  fields), their payloads encoded beforehand, untimed, published by a plain redis-py loop,
  ``--batch-size`` ``XADD`` per ``pipeline(transaction=False)``, every reply read: the ceiling
  of publishing alone;
- **raw, encoding rows**: the same loop, encoding each payload from the event's row (read
  beforehand, untimed) as it goes: what a hand-written handler does with a group;
- **sink**: for each of ``--concurrency`` (threads of one in-process ``Worker``, burst mode,
  the heap settled as the ``outbox`` command settles it), the events committed again and
  drained through ``RedisStreamSink`` at batch ``--batch-size``. Timed: the drain from the
  worker's start to its return (end to end: claims, the sink, the deletes), each ``send`` call
  (the group's messages built from its rows, their payloads encoded, then the pipeline)
  summed over the calls, and within it the building of the messages; the database statements
  over the drain, counted by a SQLAlchemy ``before_cursor_execute`` listener on the
  application's engine, per published message. This process's CPU time per message is kept
  for the raw loops and each drain: steadier than rates on a machine shared with other work.

Medians of ``--runs``, with the machine's load average at each run's start (other work on
the machine moves every figure). ``send()`` is compared with the raw loops at one thread
(summed over threads that share two CPUs, its time counts the waits for the interpreter's
lock).

    python -m benchmarks.sink_redis --events 20000 --batch-size 1000 --concurrency 1,4 --runs 3

Needs PostgreSQL (``OUTBOX_BENCH_POSTGRES_URL``) and Redis (``--redis-url``); each run's
streams are deleted after it.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import redis
import structlog
from sqlalchemy import JSON, Numeric, String, event, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from benchmarks._common import command_line, fresh_tables, machine, scratch_database, write
from outbox import Batch, BufferMixin, Outbox, Settings, add_events
from outbox.cli import settle_heap
from outbox.sinks.base import Rejection
from outbox.sinks.encoding import json_payload, message_id, payload_bytes
from outbox.sinks.redis import RedisStreamSink
from outbox.worker import Worker

DATABASE = "outbox_bench_sink_redis"
HANDLER = "to_redis"
LOAD_CHUNK = 5_000
Fields = dict[str, bytes | str]


class Base(DeclarativeBase):
    """The benchmark's buffer."""


class OrderEvent(BufferMixin, Base):
    """An order event, its payload about 200 bytes of JSON."""

    __tablename__ = "bench_sink_events"
    account: Mapped[str] = mapped_column(String(40))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    note: Mapped[str] = mapped_column(String(200))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class TimedSink(RedisStreamSink):
    """The sink, with the seconds its ``send`` calls took, and the building of messages within
    them, summed over the calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.send_seconds = 0.0
        self.build_seconds = 0.0
        self._lock = threading.Lock()
        build = self._core.messages

        def timed_build(batch: Batch[Any]) -> Any:
            started = time.perf_counter()
            try:
                return build(batch)
            finally:
                self._add("build_seconds", time.perf_counter() - started)

        self._core.messages = timed_build  # type: ignore[method-assign]

    def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        started = time.perf_counter()
        try:
            return super().send(batch)
        finally:
            self._add("send_seconds", time.perf_counter() - started)

    def _add(self, name: str, seconds: float) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + seconds)


def load(app: Outbox, events: int) -> None:
    """Commit ``events`` events in one transaction."""
    with app.engine.begin() as conn:
        for start in range(0, events, LOAD_CHUNK):
            add_events(
                conn,
                OrderEvent,
                [
                    {
                        "account": f"account-{n % 500}",
                        "amount": Decimal(f"{n}.{n % 100:02d}"),
                        "note": f"order #{n} for delivery on the north route",
                        "data": {"n": n, "items": ["sku-1", "sku-2"], "gift": n % 3 == 0},
                    }
                    for n in range(start, min(events, start + LOAD_CHUNK))
                ],
            )


def ready_messages(app: Outbox) -> list[Fields]:
    """The fields of the message the sink sends for each waiting event, in id order."""
    with Session(app.engine) as session:
        events = session.scalars(select(OrderEvent).order_by(OrderEvent.id))
        return [{"id": message_id(e), "payload": json_payload(e)} for e in events]


def waiting_rows(app: Outbox) -> list[Any]:
    """The waiting events as rows, in id order."""
    with app.engine.connect() as conn:
        return list(conn.execute(select(OrderEvent.__table__).order_by(OrderEvent.id)))


def raw_publish(client: redis.Redis, stream: str, messages: list[Fields], batch_size: int) -> float:
    """Seconds to publish ready messages, ``batch_size`` XADD to a pipeline, replies read."""
    started = time.perf_counter()
    for start in range(0, len(messages), batch_size):
        pipe = client.pipeline(transaction=False)
        for fields in messages[start : start + batch_size]:
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        check(pipe.execute(raise_on_error=False))
    return time.perf_counter() - started


def raw_encode_and_publish(
    client: redis.Redis, stream: str, rows: list[Any], batch_size: int
) -> float:
    """Seconds to encode each row's payload and publish it, as :func:`raw_publish`."""
    table = OrderEvent.__tablename__
    started = time.perf_counter()
    for start in range(0, len(rows), batch_size):
        pipe = client.pipeline(transaction=False)
        for row in rows[start : start + batch_size]:
            values = row._asdict()
            del values["group_id"]
            fields = {"id": f"{table}-{row.id}", "payload": payload_bytes(values)}
            pipe.xadd(stream, fields)  # type: ignore[arg-type]
        check(pipe.execute(raise_on_error=False))
    return time.perf_counter() - started


def check(replies: list[Any]) -> None:
    if any(isinstance(reply, Exception) or reply is None for reply in replies):
        raise RuntimeError(f"the raw loop's XADD failed: {replies[:3]}")


def drain(app: Outbox, concurrency: int) -> tuple[float, int]:
    """Seconds for one burst worker to drain the buffer, and the statements it ran on the
    application's engine."""
    executed = [0]

    def count(*_: Any) -> None:
        executed[0] += 1

    event.listen(app.engine, "before_cursor_execute", count)
    started = time.perf_counter()
    try:
        if not Worker(app, concurrency=concurrency, burst=True).run():
            raise RuntimeError("the worker abandoned work")
        return time.perf_counter() - started, executed[0]
    finally:
        event.remove(app.engine, "before_cursor_execute", count)


def remaining(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(OrderEvent)).scalar_one())


def raw_run(url: str, client: redis.Redis, args: argparse.Namespace) -> dict[str, float]:
    """Both raw loops over the same ``--events`` messages."""
    ready_stream, encoding_stream = (f"outbox-bench-raw-{uuid.uuid4().hex[:8]}" for _ in "re")
    app = Outbox(url)
    try:
        load(app, args.events)
        messages, rows = ready_messages(app), waiting_rows(app)
        cpu = time.process_time()
        ready = raw_publish(client, ready_stream, messages, args.batch_size)
        ready_cpu = time.process_time() - cpu
        encoding = raw_encode_and_publish(client, encoding_stream, rows, args.batch_size)
        encoding_cpu = time.process_time() - cpu - ready_cpu
        with app.engine.begin() as conn:
            conn.execute(OrderEvent.__table__.delete())
    finally:
        client.delete(ready_stream, encoding_stream)
        app.engine.dispose()
    return {
        "raw_ready": args.events / ready,
        "raw_encoding": args.events / encoding,
        "cpu_us_raw_ready": ready_cpu / args.events * 1e6,
        "cpu_us_raw_encoding": encoding_cpu / args.events * 1e6,
    }


def sink_run(
    url: str, client: redis.Redis, args: argparse.Namespace, concurrency: int
) -> dict[str, float]:
    """One drain of ``--events`` events through the sink."""
    stream = f"outbox-bench-sink-{uuid.uuid4().hex[:8]}"
    app = Outbox(url, settings=Settings(poll_interval=0.05))
    sink = TimedSink(args.redis_url, stream=stream)
    app.handler(OrderEvent, name=HANDLER, batch_size=args.batch_size, max_batches=64)(sink)
    try:
        load(app, args.events)
        cpu = time.process_time()
        seconds, statements = drain(app, concurrency)
        cpu = time.process_time() - cpu
        stored, left = client.xlen(stream), remaining(app)
    finally:
        client.delete(stream)
        app.engine.dispose()
    if left or stored != args.events:
        raise RuntimeError(f"the drain left {left} events, stored {stored} of {args.events}")
    events = args.events
    return {
        "send": events / sink.send_seconds,
        "send_publishing": events / (sink.send_seconds - sink.build_seconds),
        "drain": events / seconds,
        "cpu_us_drain": cpu / events * 1e6,
        "statements_per_message": statements / events,
    }


def integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--concurrency", default="1,4", help="worker threads, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    concurrencies = integers(args.concurrency)
    if min(args.events, args.batch_size, args.runs, *concurrencies) < 1:
        parser.error("--events, --batch-size, --concurrency and --runs must be at least 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    url = scratch_database(DATABASE)
    fresh_tables(url, Base.metadata)
    settle_heap()
    client = redis.Redis.from_url(args.redis_url)
    runs: list[dict[str, float]] = []
    try:
        for run in range(args.runs):
            figures = {"load_average": os.getloadavg()[0]}
            figures |= raw_run(url, client, args)
            for concurrency in concurrencies:
                drained = sink_run(url, client, args, concurrency)
                figures |= {f"{name}_c{concurrency}": value for name, value in drained.items()}
            runs.append(figures)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:,.4g}" for k, v in figures.items()))
        version = str(client.info("server")["redis_version"])
    finally:
        client.close()
    median = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    raw = median["raw_ready"]
    one = concurrencies[0]
    results = {
        "benchmark": "sink_redis",
        "command": command_line("benchmarks.sink_redis", args),
        "machine": machine(),
        "redis": version,
        "redis_py": redis.__version__,
        "events": args.events,
        "batch_size": args.batch_size,
        "runs": [_rounded(r) for r in runs],
        # Other work on the machine moves every figure: the 1-minute load average at each
        # run's start (2 CPUs).
        "median": _rounded(median),
        "ratios": {
            name: round(value / raw, 3)
            for name, value in median.items()
            if not name.startswith(("statements", "load", "cpu"))
        },
        "send_to_raw_encoding": round(median[f"send_c{one}"] / median["raw_encoding"], 3),
    }
    print()
    print(f"{'events/s, medians of ' + str(args.runs) + ' runs':44}{'events/s':>10}{'/ raw':>7}")
    labels = {"raw_ready": "raw loop, payloads ready", "raw_encoding": "raw loop, encoding rows"}
    for c in concurrencies:
        labels |= {
            f"send_c{c}": f"sink send(), {c} thread(s)",
            f"send_publishing_c{c}": f"sink send() less building, {c} thread(s)",
            f"drain_c{c}": f"sink drain end to end, {c} thread(s)",
        }
    for name, label in labels.items():
        print(f"{label:44}{median[name]:>10,.0f}{median[name] / raw:>7.2f}")
    print(
        f"sink send() / raw loop encoding rows, {one} thread(s): "
        f"{results['send_to_raw_encoding']:.2f}"
    )
    cpu = {"raw_ready": "cpu_us_raw_ready", "raw_encoding": "cpu_us_raw_encoding"}
    cpu |= {f"drain_c{c}": f"cpu_us_drain_c{c}" for c in concurrencies}
    print(
        "this process's CPU per message (the servers' not counted): "
        + ", ".join(f"{labels[name]} {median[key]:.0f} us" for name, key in cpu.items())
    )
    for c in concurrencies:
        per = median[f"statements_per_message_c{c}"]
        print(f"database statements per published message, {c} thread(s): {per:.4f}")
    print(f"results in {write('sink_redis', results)}")


def _rounded(figures: dict[str, float]) -> dict[str, float]:
    return {
        k: round(v, 4 if k.startswith("statements") else 2 if k.startswith("load") else 0)
        for k, v in figures.items()
    }


if __name__ == "__main__":
    main()
