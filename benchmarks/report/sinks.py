"""The ready-made sinks: each against a raw client loop publishing the same messages with the
same acknowledgements, and drained end to end from PostgreSQL by one worker.

The benchmarks keep their figures in two shapes: ``sink_nats`` and ``sink_rabbitmq`` each
side's rates with their medians and one drain summary; ``sink_redis`` a row of figures per run
and their medians. Each is read into :class:`SinkFigures`, and every sink is shown and judged
the same way from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.report._format import (
    DASH,
    Rendered,
    Results,
    Target,
    count,
    few_runs,
    median,
    spread,
    table,
    target_table,
)
from benchmarks.report.targets import SINK_BATCH, SINK_DRAIN_RATE, SINK_RATIO, SINK_STATEMENTS

# What a loop is to the targets: the raw loop the sink is judged against, the sink, or a figure
# shown beside them.
RAW, SINK, SHOWN = "raw loop, judged against", "sink, judged", "shown"


@dataclass(frozen=True)
class Loop:
    """One way of publishing the benchmark's messages: each run's rate and its median, and
    this process's CPU per message in each run (empty where it was not kept)."""

    label: str
    rates: list[float]
    median: float
    role: str
    cpu: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Drain:
    """Events drained from PostgreSQL into the broker by one worker: each run's rate (one,
    where the file keeps only its summary), the median, the most statements per published
    message of the runs, and this process's CPU per event (None where not kept)."""

    label: str
    events: int
    batch_size: int
    rates: list[float]
    median: float
    statements_per_message: float
    cpu: float | None


@dataclass(frozen=True)
class SinkFigures:
    """One sink's figures, whatever the shape of its results file."""

    broker: str
    about: list[str]
    loops: list[Loop]
    ratio: float
    drains: list[Drain]


def _loads(data: dict[str, Any]) -> str:
    loads = data.get("load_average")
    if not loads:
        return ""
    values = loads if isinstance(loads, list) else [loads]
    return (
        f" The machine's load average (1 minute, {data.get('machine', {}).get('cpus', '?')} "
        f"CPUs) at "
        f"each run's start: {', '.join(f'{v:g}' for v in values)}."
    )


def _paired(
    data: dict[str, Any], raw: str, sink: str, shown: dict[str, str]
) -> tuple[list[Loop], Drain]:
    """The loops and the drain of results shaped as ``sink_nats`` and ``sink_rabbitmq``
    write them: ``<side>_messages_per_second`` (each run), ``<side>_median``,
    ``<side>_cpu_us_per_message`` (each run, optional) and one ``drain``."""

    def loop(side: str, label: str, role: str) -> Loop:
        rates = data[f"{side}_messages_per_second"]
        return Loop(
            label,
            rates,
            float(data.get(f"{side}_median", median(rates))),
            role,
            data.get(f"{side}_cpu_us_per_message", []),
        )

    loops = [loop("raw", raw, RAW)]
    loops += [
        loop(side, label, SHOWN)
        for side, label in shown.items()
        if f"{side}_messages_per_second" in data
    ]
    loops.append(loop("sink", sink, SINK))
    d = data["drain"]
    drain = Drain(
        "one worker, default concurrency",
        int(d["events"]),
        int(d["batch_size"]),
        d.get("events_per_second_runs", [d["events_per_second"]]),
        float(d["events_per_second"]),
        float(d["statements_per_message"]),
        d.get("cpu_us_per_event"),
    )
    return loops, drain


def nats_figures(data: dict[str, Any]) -> SinkFigures:
    """``sink_nats``: ``js.publish_async`` judged against, one reply subscription shown."""
    handed = (
        "their rows, as a worker hands it a group"
        if data.get("sink_input") == "rows"
        else "the same events"
    )
    loops, drain = _paired(
        data,
        "raw nats-py loop, `js.publish_async`",
        "`AsyncJetStreamSink.send`",
        {"raw_inbox": "raw loop, one reply subscription (the sink's technique)"},
    )
    about = (
        f"Groups of {count(data['group_size'])} messages, {count(data['messages'])} a run, "
        "each message's columns as JSON with its `Nats-Msg-Id` and expected stream, every "
        "`PubAck` of a group awaited together. The raw loops are handed the events built "
        f"beforehand, the sink {handed}. Messages/s, medians of the runs, spread min{DASH}max; "
        "the loop with one reply subscription is the stricter ceiling, shown, not judged. The "
        f"drain: {count(drain.events)} events committed to a PostgreSQL buffer, drained into "
        "JetStream by one in-process worker (burst, default concurrency) with the sink at "
        f"batch {count(drain.batch_size)}, from the worker's start to an empty buffer; "
        "statements counted on the worker's engine." + _loads(data)
    )
    return SinkFigures("NATS JetStream", [about], loops, float(data["sink_over_raw"]), [drain])


def rabbitmq_figures(data: dict[str, Any]) -> SinkFigures:
    """``sink_rabbitmq``: one raw loop, judged against."""
    loops, drain = _paired(data, "raw loop", "`AsyncRabbitMQSink.send`", {})
    about = (
        f"Groups of {count(data['group_size'])} messages, {count(data['messages'])} a run, "
        "each message's columns as JSON with its `message_id`, persistent and `mandatory`, on "
        "a channel with publisher confirms, every message of a group written before its "
        "confirms are awaited together (the raw loop's client: see the benchmark's "
        f"docstring). Messages/s, medians of the runs, spread min{DASH}max. The drain: "
        f"{count(drain.events)} events committed to a PostgreSQL buffer, drained into RabbitMQ "
        "by one in-process worker (burst, default concurrency) with the sink at batch "
        f"{count(drain.batch_size)}, from the worker's start to an empty buffer; statements "
        "counted on the worker's engine." + _loads(data)
    )
    return SinkFigures("RabbitMQ", [about], loops, float(data["sink_over_raw"]), [drain])


def redis_figures(data: dict[str, Any]) -> SinkFigures:
    """``sink_redis``: a row of figures per run. The raw loop that encodes each payload as it
    goes is judged against (it publishes the same messages doing the same work, as the other
    brokers' raw loops do); the one given its payloads encoded is the ceiling of publishing
    alone, shown. ``send()`` is compared at the first thread count the run names."""
    runs: list[dict[str, Any]] = data["runs"]
    medians: dict[str, Any] = data["median"]

    def column(key: str) -> list[float]:
        return [run[key] for run in runs if key in run]

    threads = [int(key.removeprefix("drain_c")) for key in medians if key.startswith("drain_c")]
    one = threads[0]
    loops = [
        Loop(
            "raw redis-py loop, encoding each payload from its row",
            column("raw_encoding"),
            float(medians["raw_encoding"]),
            RAW,
            column("cpu_us_raw_encoding"),
        ),
        Loop(
            "raw loop, payloads encoded beforehand (the ceiling of publishing alone)",
            column("raw_ready"),
            float(medians["raw_ready"]),
            SHOWN,
            column("cpu_us_raw_ready"),
        ),
        Loop(
            f"`RedisStreamSink.send`, {_threads(one)}, in the drain",
            column(f"send_c{one}"),
            float(medians[f"send_c{one}"]),
            SINK,
        ),
        Loop(
            f"`send` less building the messages, {_threads(one)}",
            column(f"send_publishing_c{one}"),
            float(medians[f"send_publishing_c{one}"]),
            SHOWN,
        ),
    ]
    drains = [
        Drain(
            f"one worker, {_threads(c)}",
            int(data["events"]),
            int(data["batch_size"]),
            column(f"drain_c{c}"),
            float(medians[f"drain_c{c}"]),
            max(column(f"statements_per_message_c{c}")),
            medians.get(f"cpu_us_drain_c{c}"),
        )
        for c in threads
    ]
    ratio = data.get("send_to_raw_encoding", medians[f"send_c{one}"] / medians["raw_encoding"])
    about = (
        f"{count(data['events'])} events a run, `XADD` pipelined {count(data['batch_size'])} "
        "to a round trip, every reply read (Redis "
        f"{data.get('redis', '?')}, redis-py {data.get('redis_py', '?')}). The sink is timed "
        "within its drains from PostgreSQL (one in-process worker, burst, at each thread "
        f"count): `send()` summed over its calls, and the drain end to end. Events/s, medians "
        f"of the runs, spread min{DASH}max; statements counted on the worker's engine."
        + _loads({**data, "load_average": column("load_average")})
    )
    return SinkFigures("Redis Streams", [about], loops, float(ratio), drains)


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _cpu(values: list[float] | float | None) -> str:
    if values is None or values == []:
        return DASH
    return f"{median(values) if isinstance(values, list) else values:.0f}"


def _targets(benchmark: str, figures: SinkFigures) -> list[Target]:
    """The issue's three targets for one sink."""
    broker = figures.broker
    raw = next(loop for loop in figures.loops if loop.role == RAW)
    sink = next(loop for loop in figures.loops if loop.role == SINK)
    targets = [
        Target(
            benchmark,
            f"{broker}: sink / raw loop publishing the same messages with the same "
            f"acknowledgements ≥ {SINK_RATIO:g}",
            f"{figures.ratio:.2f} ({count(sink.median)} / {count(raw.median)} messages/s)",
            figures.ratio >= SINK_RATIO,
        )
    ]
    at_batch = [d for d in figures.drains if d.batch_size == SINK_BATCH]
    statements = (
        f"{broker}: database statements per published message ≤ {SINK_STATEMENTS:g} at batch "
        f"{count(SINK_BATCH)}"
    )
    if at_batch:
        worst = max(d.statements_per_message for d in at_batch)
        targets.append(
            Target(
                benchmark,
                statements,
                f"{worst:.4f} (the most of the runs)",
                worst <= SINK_STATEMENTS,
            )
        )
    else:
        batches = ", ".join(count(d.batch_size) for d in figures.drains)
        targets.append(Target(benchmark, statements, f"drained at batch {batches} only", None))
    best = max(figures.drains, key=lambda d: d.median)
    among = f", the best of {len(figures.drains)}" if len(figures.drains) > 1 else ""
    runs = "one run" if len(best.rates) == 1 else f"median of {len(best.rates)} runs"
    targets.append(
        Target(
            benchmark,
            f"{broker}: events/s drained from PostgreSQL into the broker, acknowledged, by one "
            f"worker ≥ {count(SINK_DRAIN_RATE)}",
            f"{count(best.median)} ({best.label}{among}, {runs}; "
            f"{best.median / SINK_DRAIN_RATE:.2f} of the aim)",
            best.median >= SINK_DRAIN_RATE,
        )
    )
    return targets


def render(benchmark: str, figures: SinkFigures) -> Rendered:
    """A sink's tables and its targets."""
    lines = [*figures.about, ""]
    lines += few_runs(max(len(loop.rates) for loop in figures.loops))
    raw = next(loop for loop in figures.loops if loop.role == RAW)
    body = [
        [
            loop.label,
            str(len(loop.rates)),
            count(loop.median),
            spread(loop.rates),
            f"{figures.ratio if loop.role == SINK else loop.median / raw.median:.2f}",
            _cpu(loop.cpu),
            loop.role,
        ]
        for loop in figures.loops
    ]
    lines += table(
        ["publishing", "runs", "messages/s", "spread", "/ raw loop", "CPU µs/message", ""], body
    )
    body = [
        [
            drain.label,
            count(drain.events),
            count(drain.batch_size),
            str(len(drain.rates)),
            count(drain.median),
            spread(drain.rates),
            f"{drain.statements_per_message:.4f}",
            _cpu(drain.cpu),
        ]
        for drain in figures.drains
    ]
    lines += table(
        [
            "drain from PostgreSQL",
            "events",
            "batch",
            "runs",
            "events/s",
            "spread",
            "statements/message (most)",
            "CPU µs/event",
        ],
        body,
    )
    targets = _targets(benchmark, figures)
    lines += target_table(targets)
    return lines, targets


def _renderer(read: Callable[[dict[str, Any]], SinkFigures]) -> Callable[[Results], Rendered]:
    def rendered(results: Results) -> Rendered:
        return render(results.benchmark, read(results.data))

    rendered.__doc__ = read.__doc__
    return rendered


sink_nats = _renderer(nats_figures)
sink_rabbitmq = _renderer(rabbitmq_figures)
sink_redis = _renderer(redis_figures)
