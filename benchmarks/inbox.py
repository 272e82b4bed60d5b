"""The inbox's proof: deliveries through RabbitMQ, a fifth of them of an id delivered before,
consumers SIGKILLed at random and between their commit and their ack, and no second effect.

For each database (``--databases``: PostgreSQL, MariaDB, SQLite; a scratch database or file of
its own, dropped at the end), on this machine's RabbitMQ (``OUTBOX_BENCH_RABBITMQ_URL``, default
guest on 127.0.0.1:5672) with a durable queue of its own, deleted at the end:

- a publisher (a process) publishes ``--deliveries`` persistent messages, confirmed 1,000 at a
  time: ``--repeat-fraction`` of them repeat the ``message_id`` of a message published before
  (chosen at random among all published so far, so that a repeat comes seconds to the whole
  run after its first copy), the others each a distinct id;
- ``--consumers`` consumer processes each take up to ``--prefetch`` messages (``basic_qos``)
  and handle them as one batch in one transaction: ``fresh = inbox.receive_many(session,
  ids)``, one row for each id to have its effect into an effects table that has no unique
  constraint on the id (a second effect would be a second row) and one row recording the
  batch; commit; then ``basic_ack(multiple=True)``;
- a supervisor SIGKILLs ``--kills`` consumers at random points of the run and starts a
  replacement each time: every other kill is aimed between a commit and its ack (the victim
  is asked to hold its next committed batch unacknowledged for ``--hold`` seconds, and is
  killed while it does), the rest land wherever the victim is; a consumer also holds a batch
  with probability ``--hold-fraction``. The broker redelivers what a killed consumer had not
  acknowledged, marked ``redelivered``.

When the queue is empty and every delivery handled, the consumers are stopped and the
database checked: one effect row per distinct id published (0 lost), no id with two (0
duplicates), as many ids in the inbox. Then every id is put past its horizon and
``outbox.inbox.prune`` deletes them, timed. Deliveries are counted from the rows the batches
committed: a batch killed before its commit is delivered again and counted then.

    python -m benchmarks.inbox --deliveries 1000000 --repeat-fraction 0.2 --consumers 4 \\
        --kills 20 --databases postgresql

Each database writes ``results/inbox_<database>.json``. Consumers, publisher, broker and
database share the machine's CPUs: the rates are those of all of them together.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pika
from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from benchmarks._common import (
    DATABASES,
    REPOSITORY,
    command_line,
    fraction,
    machine,
    reader_engine,
    scratch,
    server_version,
    write,
)
from outbox import Outbox, schema
from outbox._db.dialects.clock import db_now_plus
from outbox.inbox import PRUNE_CHUNK, is_retryable, prune

RABBITMQ_URL = os.environ.get("OUTBOX_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
INBOX = "proof"
PUBLISH_GROUP = 1000  # messages written before their confirms are awaited together
IDLE_SECONDS = 0.05  # a consumer handles a part batch after this long without a message
SETTLED_SECONDS = 2.0  # no delivery handled for this long, the queue empty: the run is over
AIM_SECONDS = 15.0  # an aimed kill waits this long for its victim to hold a committed batch
TRANSIENT_RETRIES = 10  # a batch's transaction tried again after a deadlock or a lock timeout
MINUTE = 60.0

metadata = MetaData()

effects = Table(
    "bench_inbox_effects",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    # No unique constraint: an effect had twice is a second row.
    Column("message_id", String(64), nullable=False),
    Column("consumer", String(40), nullable=False),
)

batches = Table(
    "bench_inbox_batches",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("consumer", String(40), nullable=False),
    Column("deliveries", Integer, nullable=False),
    Column("new", Integer, nullable=False, comment="effects had: the handler's runs"),
    Column("redelivered", Integer, nullable=False, comment="the broker's redelivered flag"),
    Column("redelivered_seen", Integer, nullable=False, comment="redelivered, and no effect"),
    Column("repeats", Integer, nullable=False, comment="published again by the publisher"),
    Column("repeats_seen", Integer, nullable=False, comment="published again, and no effect"),
    Column("gap_min", Double, nullable=True, comment="seconds since the first publication"),
    Column("gap_max", Double, nullable=True),
    Column("gap_sum", Double, nullable=False),
    Column("gaps_over_minute", Integer, nullable=False),
    Column("retries", Integer, nullable=False),
    Column("committed_at", Double, nullable=False, comment="time.time() before the commit"),
)


@dataclass
class Options:
    """One proof's sizes and faults."""

    deliveries: int = 1_000_000
    repeat_fraction: float = 0.2
    consumers: int = 4
    prefetch: int = 500
    kills: int = 20
    hold: float = 1.0
    hold_fraction: float = 0.005
    seed: int = 0
    timeout: float = 3600.0
    prune_chunks: int | None = None
    rabbitmq_url: str = RABBITMQ_URL

    @property
    def repeats(self) -> int:
        return round(self.deliveries * self.repeat_fraction)

    @property
    def distinct(self) -> int:
        return self.deliveries - self.repeats


@dataclass
class Kill:
    """One SIGKILL: its victim, the deliveries handled when it landed, and whether the victim
    held a committed batch unacknowledged then."""

    consumer: str
    at_deliveries: int
    aimed: bool
    between_commit_and_ack: bool
    seconds: float


@dataclass
class Proof:
    """What one database's run measured."""

    database: str
    server: str
    published: dict[str, Any] = field(default_factory=dict)
    deliveries: dict[str, Any] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    seconds: float = 0.0
    deliveries_per_second: float = 0.0
    prune: dict[str, Any] = field(default_factory=dict)
    queue_left: int = 0
    load_average: dict[str, float] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return int(self.effects["lost"])

    @property
    def duplicated(self) -> int:
        return int(self.effects["ids_with_two_effects"])


def message_id(run: str, n: int) -> str:
    """The ``n``-th distinct id of a run: random-looking (a UUID's form), as senders' ids are,
    and computed again whenever needed rather than kept."""
    return str(uuid.UUID(bytes=hashlib.blake2b(f"{run}:{n}".encode(), digest_size=16).digest()))


# --- the publisher (a process of its own) ---------------------------------------------------


async def _publish(config: dict[str, Any]) -> dict[str, Any]:
    # amqp_clients reads the broker's URL from the environment its process was given.
    from benchmarks.amqp_clients import PikaPublisher

    rng = random.Random(config["seed"])
    total, repeats, run = config["deliveries"], config["repeats"], config["run"]
    queue = config["queue"]
    # The first message is distinct: every repeat has an earlier message to repeat.
    repeat_at = set(rng.sample(range(1, total), repeats)) if repeats else set()
    first_published = array.array("d")
    gaps: list[float] = []
    publisher = await PikaPublisher().open()
    started = time.time()
    try:
        for start in range(0, total, PUBLISH_GROUP):
            for position in range(start, min(start + PUBLISH_GROUP, total)):
                now = time.time()
                headers: dict[str, Any] | None = None
                if position in repeat_at:
                    n = rng.randrange(len(first_published))
                    # AMQP tables take no floats: milliseconds.
                    headers = {"first": round(1000 * first_published[n])}
                    gaps.append(now - first_published[n])
                else:
                    n = len(first_published)
                    first_published.append(now)
                properties = pika.BasicProperties(
                    message_id=message_id(run, n), delivery_mode=2, headers=headers
                )
                publisher.publish("", queue, b'{"amount": 1}', properties)
            await publisher.confirmed()
    finally:
        await publisher.close()
    gaps.sort()
    return {
        "messages": total,
        "distinct": len(first_published),
        "repeats": len(gaps),
        "seconds": round(time.time() - started, 2),
        "repeat_gap_seconds": _gap_summary(gaps),
    }


def _gap_summary(ordered: list[float]) -> dict[str, float]:
    if not ordered:
        return {}

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 2)

    return {
        "min": round(ordered[0], 3),
        "p10": at(0.10),
        "p50": at(0.50),
        "p90": at(0.90),
        "max": round(ordered[-1], 2),
        "over_a_minute": sum(1 for g in ordered if g >= MINUTE),
    }


def publisher_main(config: dict[str, Any]) -> None:
    summary = asyncio.run(_publish(config))
    Path(config["summary"]).write_text(json.dumps(summary))


# --- a consumer (a process of its own) ------------------------------------------------------


class Consumer:
    """Batches of deliveries, each handled in one transaction, then acknowledged."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.name: str = config["name"]
        self.control = Path(config["control"])
        self.hold: float = config["hold"]
        self.hold_fraction: float = config["hold_fraction"]
        self.rng = random.Random(f"{config['seed']}:{self.name}")
        self.app = Outbox(config["url"])
        self.inbox = self.app.inbox(INBOX)
        self.engine = self.app.engine
        self.stopping = False

    def run(self, rabbitmq_url: str, queue: str, prefetch: int) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        batch: list[tuple[Any, Any]] = []
        for method, properties, _body in channel.consume(queue, inactivity_timeout=IDLE_SECONDS):
            if method is not None:
                batch.append((method, properties))
                if len(batch) < prefetch:
                    continue
            if batch:
                self.handle(channel, batch)
                batch = []
            if self.stopping:
                break
        channel.cancel()
        connection.close()
        self.engine.dispose()

    def _stop(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def handle(self, channel: Any, batch: list[tuple[Any, Any]]) -> None:
        """One transaction: the inbox, the effects of the new ids, the batch's row; commit;
        hold when asked (or by chance); ack the batch."""
        ids = [properties.message_id for _, properties in batch]
        for retries in range(TRANSIENT_RETRIES + 1):
            try:
                self._transaction(batch, ids, retries)
                break
            except DBAPIError as error:
                if retries == TRANSIENT_RETRIES or not is_retryable(error):
                    raise
        request = self.control / f"{self.name}.hold"
        if request.exists() or self.rng.random() < self.hold_fraction:
            held = self.control / f"{self.name}.held"
            held.touch()
            request.unlink(missing_ok=True)
            time.sleep(self.hold)  # committed, not acknowledged: a kill now is redelivered
            held.unlink()
        channel.basic_ack(batch[-1][0].delivery_tag, multiple=True)

    def _transaction(self, batch: list[tuple[Any, Any]], ids: list[str], retries: int) -> None:
        with Session(self.engine) as session, session.begin():
            fresh = self.inbox.receive_many(session, ids)
            now = time.time()
            new = [m for m, first in zip(ids, fresh, strict=True) if first]
            if new:
                session.execute(
                    insert(effects), [{"message_id": m, "consumer": self.name} for m in new]
                )
            redelivered_seen = repeats_seen = 0
            gaps: list[float] = []
            for (method, properties), first in zip(batch, fresh, strict=True):
                if first:
                    continue  # the delivery that had the effect
                redelivered_seen += bool(method.redelivered)
                published = (properties.headers or {}).get("first")
                if published is not None:
                    repeats_seen += 1
                    gaps.append(now - int(published) / 1000)
            session.execute(
                insert(batches),
                {
                    "consumer": self.name,
                    "deliveries": len(batch),
                    "new": len(new),
                    "redelivered": sum(bool(method.redelivered) for method, _ in batch),
                    "redelivered_seen": redelivered_seen,
                    "repeats": sum((p.headers or {}).get("first") is not None for _, p in batch),
                    "repeats_seen": repeats_seen,
                    "gap_min": min(gaps, default=None),
                    "gap_max": max(gaps, default=None),
                    "gap_sum": sum(gaps),
                    "gaps_over_minute": sum(1 for g in gaps if g >= MINUTE),
                    "retries": retries,
                    "committed_at": now,
                },
            )


def consumer_main(config: dict[str, Any]) -> None:
    Consumer(config).run(config["rabbitmq_url"], config["queue"], config["prefetch"])


# --- the supervisor ---------------------------------------------------------------------------


def _role(role: str, config: dict[str, Any], log: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.inbox", f"--{role}", json.dumps(config)],
        cwd=REPOSITORY,
        env={**os.environ, **(env or {})},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def _channel(rabbitmq_url: str) -> Iterator[Any]:
    """A channel on a connection of its own, closed at the end: the supervisor's calls are
    minutes apart, longer than a blocking connection keeps its heartbeats without being
    called."""
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


@contextlib.contextmanager
def _queue(rabbitmq_url: str) -> Iterator[str]:
    """A durable queue of the run's own, deleted at the end."""
    name = f"outbox-inbox-proof-{uuid.uuid4().hex[:12]}"
    with _channel(rabbitmq_url) as channel:
        channel.queue_declare(name, durable=True)
    try:
        yield name
    finally:
        with _channel(rabbitmq_url) as channel:
            channel.queue_delete(name)


def _waiting(rabbitmq_url: str, queue: str) -> int:
    """Messages ready in the queue (not those delivered and unacknowledged)."""
    with _channel(rabbitmq_url) as channel:
        return int(channel.queue_declare(queue, passive=True).method.message_count)


def _handled(engine: Engine) -> tuple[int, float | None]:
    with engine.connect() as conn:
        row = conn.execute(
            select(
                func.coalesce(func.sum(batches.c.deliveries), 0), func.max(batches.c.committed_at)
            )
        ).one()
    return int(row[0]), row[1]


def prove(url: str, options: Options, log: Any = print) -> Proof:
    """Run the proof on the (existing, empty) database of ``url``: outbox's tables and the
    benchmark's are created, and the benchmark's dropped at the end."""
    rng = random.Random(options.seed)
    reader = reader_engine(url)
    with reader.begin() as conn:
        metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        metadata.create_all(conn)
        conn.execute(schema.inbox.delete().where(schema.inbox.c.inbox == INBOX))
        server = server_version(conn)
    database = reader.dialect.name
    proof = Proof(database="mariadb" if database == "mysql" else database, server=server)
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-inbox-proof-") as directory:
            _run(url, options, rng, reader, Path(directory), proof, log)
        _check(reader, proof)
        _prune(url, reader, proof, options.prune_chunks)
    finally:
        with reader.begin() as conn:
            metadata.drop_all(conn)
        reader.dispose()
    return proof


def _run(
    url: str,
    options: Options,
    rng: random.Random,
    reader: Engine,
    control: Path,
    proof: Proof,
    log: Any,
) -> None:
    processes: dict[int, Any] = {}
    generation = 0
    with _queue(options.rabbitmq_url) as queue:
        common = {
            "url": url,
            "control": str(control),
            "hold": options.hold,
            "hold_fraction": options.hold_fraction,
            "seed": options.seed,
            "rabbitmq_url": options.rabbitmq_url,
            "queue": queue,
            "prefetch": options.prefetch,
        }

        def start(slot: int) -> None:
            nonlocal generation
            generation += 1
            config = {**common, "name": f"c{slot}-{generation}"}
            processes[slot] = (config["name"], _role("consumer", config, control / "log"))

        summary = control / "published.json"
        publisher = _role(
            "publisher",
            {
                "deliveries": options.deliveries,
                "repeats": options.repeats,
                "run": uuid.uuid4().hex,
                "seed": options.seed,
                "queue": queue,
                "summary": str(summary),
            },
            control / "log",
            env={"OUTBOX_BENCH_RABBITMQ_URL": options.rabbitmq_url},
        )
        started = time.time()
        proof.load_average["start"] = round(os.getloadavg()[0], 2)
        try:
            for slot in range(options.consumers):
                start(slot)
            # The kills land at random points of the deliveries, spread over the run.
            due = _kill_points(rng, options)
            last_change, last_handled = time.monotonic(), -1
            while True:
                if time.time() - started > options.timeout:
                    raise RuntimeError(f"not done after {options.timeout:g} s")
                handled, _ = _handled(reader)
                if handled != last_handled:
                    last_change, last_handled = time.monotonic(), handled
                if due and handled >= due[0]:
                    due.pop(0)
                    aimed = len(proof.kills) % 2 == 0
                    name, landed = _kill(processes, start, rng, control, aimed)
                    seconds = round(time.time() - started, 1)
                    proof.kills.append(Kill(name, handled, aimed, landed, seconds))
                    log(f"  kill {len(proof.kills)}: {proof.kills[-1]}")
                for name, process in processes.values():
                    if process.poll() is not None:
                        raise RuntimeError(f"consumer {name} exited ({process.returncode})")
                if publisher.poll() not in (None, 0):
                    raise RuntimeError(f"the publisher exited ({publisher.returncode})")
                if (
                    publisher.poll() == 0
                    and not due
                    and handled >= options.deliveries
                    and time.monotonic() - last_change > SETTLED_SECONDS
                    and _waiting(options.rabbitmq_url, queue) == 0
                ):
                    break
                time.sleep(0.1)
            for _, process in processes.values():
                process.send_signal(signal.SIGTERM)
            for name, process in processes.values():
                if process.wait(60) != 0:
                    raise RuntimeError(f"consumer {name} stopped with {process.returncode}")
            proof.load_average["end"] = round(os.getloadavg()[0], 2)
            processes.clear()
            proof.queue_left = _waiting(options.rabbitmq_url, queue)
        except BaseException:
            tail = (control / "log").read_text(errors="replace")[-3000:]
            log(f"  processes' output (tail):\n{tail}")
            raise
        finally:
            for _, process in processes.values():
                process.kill()
                process.wait()
            if publisher.poll() is None:
                publisher.kill()
                publisher.wait()
        proof.published = json.loads(summary.read_text())
    handled, last = _handled(reader)
    proof.seconds = round((last or started) - started, 2)
    proof.deliveries_per_second = round(handled / proof.seconds) if proof.seconds else 0.0


def _kill_points(rng: random.Random, options: Options) -> list[float]:
    """The deliveries handled at which each kill lands: one at random in each of as many equal
    stretches of the run (from 3% to 90% of its deliveries), so that they spread over it."""
    low, high, kills = 0.03, 0.9, options.kills
    return [
        options.deliveries * (low + (high - low) * (n + rng.random()) / kills) for n in range(kills)
    ]


def _kill(
    processes: dict[int, Any], start: Any, rng: random.Random, control: Path, aimed: bool
) -> tuple[str, bool]:
    """SIGKILL one consumer (aimed: once it holds a committed batch unacknowledged) and start
    another in its place; the victim's name, and whether it held a committed batch
    unacknowledged when killed."""
    slot = rng.choice(sorted(processes))
    name, process = processes[slot]
    held = control / f"{name}.held"
    if aimed:
        (control / f"{name}.hold").touch()
        deadline = time.monotonic() + AIM_SECONDS
        while not held.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.005)
    landed = held.exists()
    process.kill()
    process.wait()
    (control / f"{name}.hold").unlink(missing_ok=True)
    start(slot)
    return name, landed


def _check(reader: Engine, proof: Proof) -> None:
    """Effects against ids: rows, distinct ids, ids with two rows; the inbox's ids; and the
    deliveries the batches recorded."""
    with reader.connect() as conn:
        rows, distinct = conn.execute(
            select(func.count(), func.count(effects.c.message_id.distinct()))
        ).one()
        twice = conn.execute(
            select(func.count()).select_from(
                select(effects.c.message_id)
                .group_by(effects.c.message_id)
                .having(func.count() > 1)
                .subquery()
            )
        ).scalar_one()
        kept = conn.execute(
            select(func.count()).select_from(schema.inbox).where(schema.inbox.c.inbox == INBOX)
        ).scalar_one()
        totals = conn.execute(
            select(
                func.count(),
                *(
                    func.coalesce(func.sum(batches.c[c]), 0)
                    for c in (
                        "deliveries",
                        "new",
                        "redelivered",
                        "redelivered_seen",
                        "repeats",
                        "repeats_seen",
                        "gap_sum",
                        "gaps_over_minute",
                        "retries",
                    )
                ),
                func.min(batches.c.gap_min),
                func.max(batches.c.gap_max),
            )
        ).one()
    (
        batch_count,
        deliveries,
        new,
        redelivered,
        redelivered_seen,
        repeats,
        repeats_seen,
        gap_sum,
        over_minute,
        retries,
        gap_min,
        gap_max,
    ) = totals
    published = int(proof.published["distinct"])
    proof.effects = {
        "distinct_ids_published": published,
        "effect_rows": int(rows),
        "distinct_ids_with_an_effect": int(distinct),
        "lost": published - int(distinct),
        "ids_with_two_effects": int(twice),
        "extra_effect_rows": int(rows) - int(distinct),
        "inbox_ids": int(kept),
    }
    deliveries = int(deliveries)
    proof.deliveries = {
        "handled": deliveries,
        "batches": int(batch_count),
        "mean_batch": round(deliveries / batch_count, 1) if batch_count else 0,
        "handler_runs": int(new),
        "without_effect": deliveries - int(new),
        "redeliveries": deliveries - published,
        "redelivered_flag": int(redelivered),
        "redelivered_without_effect": int(redelivered_seen),
        "published_repeats": int(repeats),
        "published_repeats_without_effect": int(repeats_seen),
        "repeat_fraction": round((deliveries - published) / deliveries, 4) if deliveries else 0,
        "repeat_gap_seconds": {
            "min": None if gap_min is None else round(float(gap_min), 3),
            "mean": round(float(gap_sum) / int(repeats_seen), 2) if repeats_seen else None,
            "max": None if gap_max is None else round(float(gap_max), 2),
            "over_a_minute": int(over_minute),
        },
        "transaction_retries": int(retries),
    }


def _prune(url: str, reader: Engine, proof: Proof, chunks: int | None) -> None:
    """Every id put past its horizon (one UPDATE), then deleted by ``outbox.inbox.prune``
    (``chunks`` transactions of it, all when None)."""
    engine = Outbox(url).engine
    try:
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(
                update(schema.inbox)
                .where(schema.inbox.c.inbox == INBOX)
                .values(expires_at=db_now_plus(-MINUTE))
            )
        expired = time.perf_counter() - started
        started = time.perf_counter()
        deleted = prune(engine, chunks)
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    with reader.connect() as conn:
        left = conn.execute(select(func.count()).select_from(schema.inbox)).scalar_one()
    proof.prune = {
        "expire_seconds": round(expired, 2),
        "deleted": deleted,
        "chunk": PRUNE_CHUNK,
        "seconds": round(seconds, 2),
        "ids_per_second": round(deleted / seconds) if seconds else 0,
        "left": int(left),
        "chunks": chunks,
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("--consumer", "--publisher"):
        config = json.loads(sys.argv[2])
        (consumer_main if sys.argv[1] == "--consumer" else publisher_main)(config)
        return
    defaults = Options()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=defaults.deliveries)
    parser.add_argument("--repeat-fraction", type=fraction, default=defaults.repeat_fraction)
    parser.add_argument("--consumers", type=int, default=defaults.consumers)
    parser.add_argument("--prefetch", type=int, default=defaults.prefetch)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--hold", type=float, default=defaults.hold, help="seconds")
    parser.add_argument("--hold-fraction", type=fraction, default=defaults.hold_fraction)
    parser.add_argument(
        "--prune-chunks",
        type=int,
        default=None,
        help=f"transactions of {PRUNE_CHUNK:,} ids the prune is timed over (default: all)",
    )
    parser.add_argument("--databases", default=",".join(DATABASES))
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds")
    args = parser.parse_args()
    chosen = [d.strip() for d in args.databases.split(",") if d.strip()]
    unknown = sorted(set(chosen) - set(DATABASES))
    if unknown or not chosen:
        parser.error(f"--databases: choose among {', '.join(DATABASES)}")
    if args.deliveries < 2 or args.consumers < 1 or args.prefetch < 1 or args.kills < 0:
        parser.error("--deliveries ≥ 2, --consumers ≥ 1, --prefetch ≥ 1, --kills ≥ 0")
    options = Options(
        deliveries=args.deliveries,
        repeat_fraction=args.repeat_fraction,
        consumers=args.consumers,
        prefetch=args.prefetch,
        kills=args.kills,
        hold=args.hold,
        hold_fraction=args.hold_fraction,
        seed=args.seed,
        timeout=args.timeout,
        prune_chunks=args.prune_chunks,
    )
    for database in chosen:
        print(f"{database}: {options.deliveries:,} messages published", flush=True)
        with scratch(database, "inbox") as url:
            proof = prove(url, options, log=lambda line: print(line, flush=True))
        data = {
            "benchmark": "inbox",
            "command": command_line("benchmarks.inbox", args),
            "machine": machine(),
            "options": asdict(options) | {"rabbitmq_url": "(the broker)"},
            **asdict(proof),
            "lost": proof.lost,
            "duplicated": proof.duplicated,
        }
        print(json.dumps({k: v for k, v in data.items() if k != "kills"}, indent=2), flush=True)
        print(f"written to {write(f'inbox_{proof.database}', data)}", flush=True)
        if proof.lost or proof.duplicated or proof.queue_left:
            raise SystemExit(f"{database}: {proof.lost} lost, {proof.duplicated} duplicated")


if __name__ == "__main__":
    main()
