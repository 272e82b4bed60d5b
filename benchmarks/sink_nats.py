"""The NATS JetStream sink against a raw nats-py loop, and drained end to end from PostgreSQL.

In one run, on this machine's NATS server with JetStream (``OUTBOX_BENCH_NATS_URL``, default
nats://127.0.0.1:4222), with a stream of its own (made again before each side's turn, so that
no message is a duplicate of the turn before), deleted at the end:

(a) raw: a hand-written nats-py loop publishes ``--messages`` events in groups of
    ``--group-size``, as a user's handler would: each event's columns written as JSON, its
    ``Nats-Msg-Id`` and the expected stream as headers, every message of a group written with
    ``js.publish_async`` and the ``PubAck`` of each awaited together (the sink's pipelining
    and acknowledgement mode);
(a2) raw with one reply subscription: the same loop with ``nc.publish`` and a reply subject of
    its own per message under one wildcard subscription (the sink's technique, cheaper per
    message than ``publish_async``): the stricter ceiling, shown, not judged;
(b) sink: ``AsyncJetStreamSink.send`` publishes the same events in the same groups, handed
    over as a worker hands them, as rows (the raw loops are given the events ready-built);
(c) drain: ``--events`` events committed to a PostgreSQL buffer (a scratch database of its
    own) are drained into JetStream by one in-process worker (burst, default concurrency) with
    the sink as the handler at ``--batch-size``: events per second from the worker's start to
    an empty buffer, and the database statements per published message (every statement the
    worker's engine sends, counted by a ``before_cursor_execute`` listener).

Each of ``--runs`` runs: (a), (a2) and (b) take turns, then (c); medians are compared (sink /
raw, aim ≥ 0.8; drain, aim ≥ 10,000 events/s) and statements per message are judged at their
highest (aim ≤ 0.05). This process's CPU per message is kept for each side and each drain,
steadier than rates on a shared machine, and the load average at each run's start. The heap is
settled first, as the ``outbox`` command settles a worker's (``gc.freeze()``, a higher
threshold).

    python -m benchmarks.sink_nats --messages 20000 --group-size 1000 \\
        --events 50000 --batch-size 1000 --runs 5
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
import uuid
from importlib.metadata import version
from typing import Any

import nats
import nats.js.errors
import structlog

from benchmarks._common import command_line, drop_database, machine, scratch_database, write
from benchmarks._sinks import (
    Groups,
    OrderEvent,
    committed_groups,
    hand_written_body,
    measured_drain,
    parse_arguments,
)
from outbox import Batch, Outbox
from outbox.cli import settle_heap
from outbox.sinks.nats import MSG_ID_HEADER, AsyncJetStreamSink

DATABASE = "outbox_bench_sink_nats"
NATS_URL = os.environ.get("OUTBOX_BENCH_NATS_URL", "nats://127.0.0.1:4222")
DUPLICATE_WINDOW_SECONDS = 2 * 3600.0
"""Longer than the default retry schedule's re-send horizon: the sink's check passes."""
HANDLER = "to_nats"


async def _stream(name: str, create: bool = True) -> int:
    """Delete stream ``name`` if it exists (how many messages it held), then make it again
    empty, with no message ids to drop (unless ``create`` is false)."""
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        held = 0
        try:
            held = (await jetstream.stream_info(name)).state.messages
            await jetstream.delete_stream(name)
        except nats.js.errors.NotFoundError:
            pass
        if create:
            await jetstream.add_stream(
                name=name, subjects=[f"{name}.>"], duplicate_window=DUPLICATE_WINDOW_SECONDS
            )
        return held
    finally:
        await client.close()


async def raw(name: str, groups: Groups) -> tuple[float, float]:
    """Seconds a hand-written nats-py loop takes to publish every group, acknowledged, and
    this process's CPU seconds meanwhile."""
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        jetstream = client.jetstream()
        subject, table = f"{name}.events", OrderEvent.__tablename__
        started, cpu = time.perf_counter(), time.process_time()
        for group in groups.events:
            acks = []
            for e in group:
                body = hand_written_body(e)
                headers = {MSG_ID_HEADER: f"{table}-{e.id}"}
                acks.append(
                    await jetstream.publish_async(subject, body, stream=name, headers=headers)
                )
            answers = await asyncio.wait_for(
                asyncio.gather(*acks, return_exceptions=True), timeout=10
            )
            failed = [a for a in answers if isinstance(a, BaseException)]
            if failed:
                raise RuntimeError(f"{len(failed)} not acknowledged: {failed[0]!r}")
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await client.close()


async def raw_inbox(name: str, groups: Groups) -> tuple[float, float]:
    """Seconds a hand-written loop takes with the sink's technique rather than
    ``publish_async``: ``nc.publish`` with a reply subject of its own under one wildcard
    subscription, the ``PubAck`` counted as it comes (the stricter ceiling, shown); and this
    process's CPU seconds meanwhile."""
    client = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
    try:
        prefix = client.new_inbox()
        answered: dict[str, bool] = {}
        done = asyncio.Event()
        expected = 0

        async def on_reply(message: Any) -> None:
            answered[message.subject] = message.data.startswith(b'{"stream":')
            if len(answered) >= expected:
                done.set()

        await client.subscribe(f"{prefix}.*", cb=on_reply)
        subject, table, token = f"{name}.events", OrderEvent.__tablename__, 0
        started, cpu = time.perf_counter(), time.process_time()
        for group in groups.events:
            answered.clear()
            done.clear()
            expected = len(group)
            for e in group:
                body = hand_written_body(e)
                headers = {MSG_ID_HEADER: f"{table}-{e.id}", "Nats-Expected-Stream": name}
                token += 1
                await client.publish(subject, body, reply=f"{prefix}.{token}", headers=headers)
            await asyncio.wait_for(done.wait(), timeout=10)
            if not all(answered.values()):
                raise RuntimeError("not every message acknowledged")
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await client.close()


async def sink(name: str, groups: Groups) -> tuple[float, float]:
    """Seconds ``AsyncJetStreamSink.send`` takes to publish every group, acknowledged, each
    handed over as rows, as a worker does (started as a worker starts it: it learns its
    handler then); and this process's CPU seconds meanwhile."""
    app = Outbox(groups.url)
    publisher = AsyncJetStreamSink(NATS_URL, subject=f"{name}.events", stream=name)
    app.handler(OrderEvent, name=HANDLER, batch_size=len(groups.rows[0]))(publisher)
    await publisher.outbox_start(app, app.get_handler(HANDLER))
    try:
        started, cpu = time.perf_counter(), time.process_time()
        for rows in groups.rows:
            batch = Batch(
                rows=rows, model=OrderEvent, group_id=uuid.uuid4(), attempt=1, handler=HANDLER
            )
            rejected = await publisher.send(batch)
            if rejected:
                raise RuntimeError(f"{len(rejected)} not acknowledged: {rejected[0].reason}")
        return time.perf_counter() - started, time.process_time() - cpu
    finally:
        await publisher.outbox_stop()
        app.engine.dispose()


def drain(url: str, name: str, events: int, batch_size: int) -> dict[str, Any]:
    """Events per second drained from PostgreSQL into JetStream by one worker, and database
    statements per published message."""
    asyncio.run(_stream(name))
    sink = AsyncJetStreamSink(NATS_URL, subject=f"{name}.events", stream=name)
    return measured_drain(
        url, sink, HANDLER, events, batch_size, published=lambda: asyncio.run(_stream(name))
    )


def _median_drain(drains: list[dict[str, Any]]) -> dict[str, Any]:
    """The drains of every run in one: the median rate and time, the highest statements per
    message (the target is judged on the worst), the worst of what was left or published."""
    first = drains[0]
    return {
        "events": first["events"],
        "batch_size": first["batch_size"],
        "runs": len(drains),
        "seconds": statistics.median(d["seconds"] for d in drains),
        "cpu_us_per_event": statistics.median(d["cpu_us_per_event"] for d in drains),
        "events_per_second": round(statistics.median(d["events_per_second"] for d in drains)),
        "events_per_second_runs": [d["events_per_second"] for d in drains],
        "left_in_buffer": max(d["left_in_buffer"] for d in drains),
        "published": min(d["published"] for d in drains),
        "statements": max(d["statements"] for d in drains),
        "statements_per_message": max(d["statements_per_message"] for d in drains),
    }


def main() -> None:
    args = parse_arguments(__doc__.split("\n\n")[0])
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    url = scratch_database(DATABASE)
    name = f"outbox-bench-{uuid.uuid4().hex[:12]}"
    try:
        groups = committed_groups(url, args.messages, args.group_size)
        settle_heap()
        sides = {"raw": raw, "raw_inbox": raw_inbox, "sink": sink}
        rates: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        drains: list[dict[str, Any]] = []
        loads: list[float] = []
        for run in range(args.runs):
            loads.append(round(os.getloadavg()[0], 2))
            # Taking turns, the order rotating: the machine's drift hits every side alike.
            order = list(sides)[run % 3 :] + list(sides)[: run % 3]
            for side in order:
                asyncio.run(_stream(name))
                seconds, spent = asyncio.run(sides[side](name, groups))
                published = asyncio.run(_stream(name))
                if published != args.messages:
                    raise RuntimeError(f"{side}: {published} in the stream, not {args.messages}")
                rates[side].append(round(args.messages / seconds))
                cpu[side].append(round(1e6 * spent / args.messages, 1))
                print(
                    f"run {run + 1} {side}: {rates[side][-1]:,} messages/s, "
                    f"{cpu[side][-1]} µs CPU per message"
                )
            drains.append(drain(url, name, args.events, args.batch_size))
            print(f"run {run + 1} drain: {drains[-1]['events_per_second']:,} events/s")
        raw_rate = statistics.median(rates["raw"])
        inbox_rate = statistics.median(rates["raw_inbox"])
        sink_rate = statistics.median(rates["sink"])
        ratio = round(sink_rate / raw_rate, 3)
        inbox_ratio = round(sink_rate / inbox_rate, 3)
        drained = _median_drain(drains)
        print(f"sink / raw: {sink_rate:,.0f} / {raw_rate:,.0f} messages/s = {ratio} (aim ≥ 0.8)")
        print(
            f"sink / raw with one reply subscription: {sink_rate:,.0f} / {inbox_rate:,.0f} "
            f"messages/s = {inbox_ratio} (shown)"
        )
        print(
            f"drain: {drained['events_per_second']:,} events/s, median of {args.runs} "
            f"({args.events:,} events, batch {args.batch_size:,}; aim ≥ 10,000); "
            f"{drained['statements_per_message']} statements per message at most (aim ≤ 0.05)"
        )
    finally:
        asyncio.run(_stream(name, create=False))
        drop_database(DATABASE)
    write(
        "sink_nats",
        {
            "benchmark": "sink_nats",
            "command": command_line("benchmarks.sink_nats", args),
            "machine": machine(),
            "nats_py": version("nats-py"),
            "load_average": loads,
            "messages": args.messages,
            "group_size": args.group_size,
            "sink_input": "rows",
            "raw_messages_per_second": rates["raw"],
            "sink_messages_per_second": rates["sink"],
            "raw_inbox_messages_per_second": rates["raw_inbox"],
            "raw_median": raw_rate,
            "raw_inbox_median": inbox_rate,
            "sink_median": sink_rate,
            "sink_over_raw": ratio,
            "sink_over_raw_inbox": inbox_ratio,
            "raw_cpu_us_per_message": cpu["raw"],
            "raw_inbox_cpu_us_per_message": cpu["raw_inbox"],
            "sink_cpu_us_per_message": cpu["sink"],
            "drain": drained,
            "drains": drains,
        },
    )


if __name__ == "__main__":
    main()
