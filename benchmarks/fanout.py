r"""The fan-out's proof: one buffer fanned out to four consumers, a healthy one and three in
trouble (paused, failing half its calls, rate-limited), while the application writes and the
workers are SIGKILLed at random; each consumer gets every event, the healthy one keeps its
promise while the others lag, and every row is gone at the end.

On one database (``--database``: a scratch database or file of its own, dropped at the end),
the application of ``benchmarks/fanout_app.py`` (its docstring says what each consumer does
and how it records what it was handed) runs through the real command, ``python -m outbox
--app benchmarks.fanout_app:app work --processes P --concurrency C`` (the fan-out and every
consumer in ``Urgency.REALTIME``, whose promise is a minute):

- the ``paused`` consumer is paused (``outbox.ops.flow.pause``) before the first event is
  written, and resumed ``--pause`` seconds later (``--resume-when-healthy-done``: and not
  before the healthy consumer has every event);
- once the workers have registered, a writer process writes ``--events`` events to the source
  buffer, ``--transaction`` per transaction, ``--rate`` events a second (0: as fast as it can);
- ``failing`` raises on ``--fail-fraction`` of its calls, at random, and retries each group
  ``--retry-seconds`` later; ``limited`` may start ``--limited-calls`` calls a second across
  the fleet (``RateLimit``), of ``--consumer-batch-size`` events each, fewer than are written;
- ``--kills`` SIGKILLs land on the command's worker processes (one chosen at random among
  those alive and registered), one at a random point of each of as many equal stretches of
  the run's progress (from 3% to 90% of the events the four consumers will have recorded, read
  from the size of their records); the command starts a replacement each time. The killed
  worker's groups come back once a survivor finds it silent (``Settings.worker_stale_after``,
  20 s) or, when none may judge it yet (a worker judges others only after its own heartbeats
  have been steady that long: kills close together leave none), once their lease ends:
  ``--lease`` is 20 s here rather than the command's 60, so that a kill holds the events it
  took less than the healthy consumer's promise of a minute;
- every ``--sample-every`` seconds each buffer's oldest event's age is read, as ``outbox
  status`` reads it (the database's clock against the lowest id's ``created_at``, which a copy
  keeps from the source: the age is the event's since the application wrote it).

The run ends when the writer is done, the paused consumer resumed, every kill landed and every
buffer empty. Then, per consumer from its records: events handed to calls that returned,
distinct events, lost (written, never handed to a call that returned: must be 0), duplicates
(handed again: a worker killed between the call and its commit), calls and failed calls, when
it was done; its oldest age's max (and when), p50 and p95; rows left in each buffer and dead
letters (must be 0), and the healthy consumer's oldest age against its band's promise.

    python -m benchmarks.fanout --database postgresql --events 200000 --rate 1000 \
        --pause 60 --limited-calls 0.5 --kills 10 --lease 20

Writes ``results/fanout_<database>.json`` (``--suffix``: appended to the name). The workers,
the writer, the sampler and the database share the machine's CPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, func, select

from benchmarks._common import (
    DATABASES,
    REPOSITORY,
    command_line,
    machine,
    percentile,
    scratch,
    server_version,
    write,
)
from benchmarks.fanout_app import (
    CONSUMERS,
    FAILED,
    HEALTHY,
    MODELS,
    OK,
    PAUSED,
    URGENCY,
    Base,
    Config,
    FanoutEvent,
    build_app,
    record_files,
    record_lines,
)
from outbox import Outbox, add_events, schema
from outbox._db import queries, run_in_transaction
from outbox.ops import flow
from outbox.schema import ArchiveStatus

APP = "benchmarks.fanout_app:app"
SOURCE = "source"  # the source buffer, among the buffers sampled
ACTOR = "benchmarks.fanout"  # who paused and resumed, in the operations log
KILL_SPREAD = (0.03, 0.9)  # the stretch of the run's progress the kills land in
START_SECONDS = 60.0  # the workers register within this long, or the run fails
REPLACEMENT_SECONDS = 30.0  # a kill waits this long at most for a live worker to kill
STOP_SECONDS = 60.0  # the command stops this long after its SIGTERM at most
ERRORS_KEPT = 10  # of the command's log, the error lines kept in the results
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
ROUTINE_EVENTS = ('"outbox.batch.handled"', '"outbox.distribute.enqueued"')


@dataclass
class Options:
    """One proof's sizes, pace and faults."""

    events: int = 200_000
    rate: float = 1000.0
    transaction: int = 100
    pause: float = 60.0
    resume_when_healthy_done: bool = False
    batch_size: int = 1000
    consumer_batch_size: int = 1000
    fail_fraction: float = 0.5
    retry_seconds: float = 0.5
    limited_calls: float = 0.5
    limited_concurrency: int = 1
    processes: int = 2
    concurrency: int = 4
    kills: int = 10
    lease: float | None = 20.0  # None: the command's own (60 s); see the docstring
    poll_interval: float | None = None
    rescue_interval: float | None = None
    worker_stale_after: float | None = None
    sample_every: float = 0.5
    seed: int = 0
    timeout: float = 1800.0

    def config(self, records: Path) -> Config:
        """What the application's processes are told."""
        given = Config(
            records=str(records),
            batch_size=self.batch_size,
            consumer_batch_size=self.consumer_batch_size,
            fail_fraction=self.fail_fraction,
            retry_seconds=self.retry_seconds,
            limited_calls=self.limited_calls,
            limited_concurrency=self.limited_concurrency,
        )
        if self.rescue_interval is not None:
            given = replace(given, rescue_interval=self.rescue_interval)
        if self.worker_stale_after is not None:
            given = replace(given, worker_stale_after=self.worker_stale_after)
        return given


@dataclass
class Kill:
    """One SIGKILL: the worker's pid, the run's progress and the seconds since the writer
    started when it landed."""

    pid: int
    progress: float
    seconds: float


@dataclass
class Proof:
    """What one run measured. Times are seconds since the writer started."""

    database: str
    server: str
    started: float = 0.0
    """The writer's start, on the wall clock (``time.time()``)."""
    written: int = 0
    write_seconds: float = 0.0
    seconds: float = 0.0
    promise: float = URGENCY.promise
    consumers: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    pause: dict[str, Any] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    work_exit: int | None = None
    log: dict[str, Any] = field(default_factory=dict)
    """The command's log: its lines counted by level and event, and those of errors."""
    load_average: dict[str, float] = field(default_factory=dict)

    @property
    def lost(self) -> dict[str, int]:
        """Events lost per consumer."""
        return {name: int(found["lost"]) for name, found in self.consumers.items()}

    @property
    def healthy_max_age(self) -> float:
        return float(self.consumers[HEALTHY]["age"]["max"])

    @property
    def healthy_done_before_resume(self) -> bool:
        return bool(self.pause["healthy_done_before_resume"])


# --- the writer (a process of its own) ----------------------------------------------------------


def writer_main(config: dict[str, Any]) -> None:
    """Write the events, ``transaction`` a transaction, at ``rate`` a second; the summary to a
    file at the end. ``seq`` numbers them in the order written."""
    engine = Outbox(config["url"]).engine  # set up for its database as outbox sets its own
    events, size, rate = config["events"], config["transaction"], config["rate"]
    started, begun = time.time(), time.monotonic()
    behind = 0.0
    for start in range(0, events, size):
        rows = [{"seq": n, "kind": "shipment"} for n in range(start, min(start + size, events))]

        def write_rows(conn: Connection, rows: list[dict[str, Any]] = rows) -> int:
            return add_events(conn, FanoutEvent, rows)

        run_in_transaction(engine, write_rows)
        if rate:
            due = begun + (start + len(rows)) / rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                behind = max(behind, -wait)
    finished = time.time()
    engine.dispose()
    summary = {
        "written": events,
        "started": started,
        "seconds": round(finished - started, 2),
        "most_behind_seconds": round(behind, 2),
    }
    Path(config["summary"]).write_text(json.dumps(summary))


# --- the supervisor ---------------------------------------------------------------------------


def prove(url: str, options: Options, log: Any = print) -> Proof:
    """Run the proof on the (existing) database of ``url``: outbox's tables are created where
    missing, the benchmark's buffers afresh, and dropped at the end."""
    reader = _reader(url)
    with reader.begin() as conn:
        Base.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
        server = server_version(conn)
    database = reader.dialect.name
    proof = Proof(database="mariadb" if database == "mysql" else database, server=server)
    try:
        with tempfile.TemporaryDirectory(prefix="outbox-fanout-proof-") as directory:
            records = Path(directory) / "records"
            records.mkdir()
            config = options.config(records)
            samples = _run(url, options, config, reader, Path(directory), proof, log)
            _count(records, options.events, proof)
        _ages(samples, proof)
        _left(reader, proof)
    finally:
        with reader.begin() as conn:
            Base.metadata.drop_all(conn)
        reader.dispose()
    return proof


Sample = tuple[float, dict[str, float | None]]


def _run(
    url: str,
    options: Options,
    config: Config,
    reader: Engine,
    directory: Path,
    proof: Proof,
    log: Any,
) -> list[Sample]:
    rng = random.Random(options.seed)
    control = build_app(config, url)
    output = directory / "work.log"
    work = _work(url, options, config, output)
    samples: list[Sample] = []
    writer: subprocess.Popen[bytes] | None = None
    try:
        _registered(reader, work, options.processes)
        flow.pause(control, PAUSED, reason="the fan-out proof", actor=ACTOR)
        paused_at = time.monotonic()
        summary = directory / "written.json"
        writer = _writer(url, options, summary, output)
        started = time.monotonic()
        proof.load_average["start"] = round(os.getloadavg()[0], 2)
        due = _kill_points(rng, options.kills)
        expected = _expected_bytes(options.events)
        resumed: float | None = None
        resume_asked = 0.0  # on the wall clock, as the records' times
        healthy_done: float | None = None
        while True:
            now = time.monotonic() - started
            if now > options.timeout:
                raise RuntimeError(f"not done after {options.timeout:g} s")
            ages = _oldest_ages(reader)
            samples.append((now, ages))
            written = writer.poll()
            if written not in (None, 0):
                raise RuntimeError(f"the writer exited ({written})")
            if work.poll() is not None:
                raise RuntimeError(f"outbox work exited ({work.returncode})")
            if healthy_done is None and written == 0 and _empty(ages, SOURCE, HEALTHY):
                healthy_done = now
                log(f"  the healthy consumer has every event at {now:.1f} s")
            may_resume = healthy_done is not None or not options.resume_when_healthy_done
            if resumed is None and may_resume and time.monotonic() - paused_at >= options.pause:
                # Before the resume: no call of the paused consumer may come earlier.
                resume_asked = time.time()
                flow.resume(control, PAUSED, actor=ACTOR)
                resumed = time.monotonic() - started
                log(f"  the paused consumer resumed at {resumed:.1f} s")
            if due and _recorded_bytes(directory / "records") >= due[0] * expected:
                progress = due.pop(0)
                pid = _kill(reader, work, rng)
                proof.kills.append(Kill(pid, round(progress, 3), round(now, 1)))
                log(f"  kill {len(proof.kills)}: {proof.kills[-1]}")
            if written == 0 and resumed is not None and not due and _empty(ages, *ages):
                break
            time.sleep(max(0.0, options.sample_every - (time.monotonic() - started - now)))
        proof.seconds = round(time.monotonic() - started, 2)
        proof.load_average["end"] = round(os.getloadavg()[0], 2)
        work.send_signal(signal.SIGTERM)
        proof.work_exit = work.wait(STOP_SECONDS)
        proof.log = _log_summary(output)
        if proof.work_exit:
            said = [ln for ln in output.read_text(errors="replace").splitlines() if _told(ln)]
            tail = "\n".join(said[-40:])
            log(f"  outbox work exited with {proof.work_exit}; what it said (tail):\n{tail}")
        written_summary = json.loads(summary.read_text())
        proof.started = float(written_summary["started"])
        proof.written = int(written_summary["written"])
        proof.write_seconds = float(written_summary["seconds"])
        proof.pause = {
            "resume_asked": resume_asked,
            "seconds": round(started + (resumed or 0.0) - paused_at, 2),
            "resumed_at": resumed,
            "healthy_done_at": healthy_done,
            "healthy_done_before_resume": healthy_done is not None
            and resumed is not None
            and healthy_done <= resumed,
            "writer_most_behind_seconds": written_summary["most_behind_seconds"],
        }
    except BaseException:
        tail = output.read_text(errors="replace")[-4000:] if output.exists() else ""
        log(f"  the processes' output (tail):\n{tail}")
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left: the command stopped them
            os.killpg(work.pid, signal.SIGKILL)
        work.wait()
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
        control.engine.dispose()
    return samples


def _work(url: str, options: Options, config: Config, output: Path) -> subprocess.Popen[bytes]:
    """The command under test, with the application's configuration in its environment."""
    command = [
        sys.executable, "-m", "outbox", "--app", APP, "--database-url", url,
        "--log-format", "json", "work",
        "--processes", str(options.processes), "--concurrency", str(options.concurrency),
    ]  # fmt: skip
    if options.lease is not None:
        command += ["--lease", str(options.lease)]
    if options.poll_interval is not None:
        command += ["--poll-interval", str(options.poll_interval)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(config.environment(), PYTHONUNBUFFERED="1")
    with output.open("ab") as out:
        # A session of its own: a run that fails kills the command and its workers together.
        return subprocess.Popen(
            command,
            cwd=REPOSITORY,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_stop_with_parent,
        )


def _writer(url: str, options: Options, summary: Path, output: Path) -> subprocess.Popen[bytes]:
    config = {
        "url": url,
        "events": options.events,
        "transaction": options.transaction,
        "rate": options.rate,
        "summary": str(summary),
    }
    with output.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fanout", "--writer", json.dumps(config)],
            cwd=REPOSITORY,
            preexec_fn=_stop_with_parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )


def _stop_with_parent() -> None:
    """In a child before it runs: SIGTERM it when the run's process dies (Linux), so that a run
    ended without its clean-up (a SIGTERM or SIGKILL to the test run) leaves no command
    working on; ``outbox work``'s workers stop once their supervisor is gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _told(line: str) -> bool:
    """A line of the command's output other than a batch's or a distribution's routine."""
    return not any(routine in line for routine in ROUTINE_EVENTS)


def _log_summary(output: Path) -> dict[str, Any]:
    """The command's JSON log lines counted by level and event; the errors' lines kept (the
    first few), the writer's lines among them aside (they are not JSON)."""
    counted: Counter[str] = Counter()
    errors: list[dict[str, Any]] = []
    for line in output.read_text(errors="replace").splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if not isinstance(found, dict) or "event" not in found:
            continue
        level = str(found.get("level"))
        counted[f"{level} {found['event']}"] += 1
        if level in ("error", "critical") and len(errors) < ERRORS_KEPT:
            errors.append(found)
    return {"lines": dict(counted.most_common()), "errors": errors}


def _reader(url: str) -> Engine:
    """An engine for the supervisor's reads: plain transactions, where outbox's SQLite engine
    takes the write lock up front."""
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30})
    return create_engine(url, pool_size=1)


def _registered(reader: Engine, work: subprocess.Popen[bytes], processes: int) -> None:
    """Wait until the command's workers have registered."""
    deadline = time.monotonic() + START_SECONDS
    while len(_live_workers(reader, work)) < processes:
        if work.poll() is not None:
            raise RuntimeError(f"outbox work exited ({work.returncode}) before its workers began")
        if time.monotonic() > deadline:
            raise RuntimeError(f"outbox work's workers not registered after {START_SECONDS:g} s")
        time.sleep(0.1)


def _live_workers(reader: Engine, work: subprocess.Popen[bytes]) -> list[int]:
    """The pids of the command's worker processes alive and registered (a killed one stays
    registered until it is found silent)."""
    with reader.connect() as conn:
        registered = {int(pid) for pid in conn.execute(select(schema.workers.c.pid)).scalars()}
    return sorted(registered & _children(work.pid))


def _children(parent: int) -> set[int]:
    """The running processes ``parent`` forked, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                found.add(int(entry.name))
    return found


def _kill_points(rng: random.Random, kills: int) -> list[float]:
    """The fractions of the run's progress at which the kills land: one at random in each of
    as many equal stretches, so that they spread over the run."""
    low, high = KILL_SPREAD
    return [low + (high - low) * (n + rng.random()) / kills for n in range(kills)]


def _expected_bytes(events: int) -> int:
    """What the four consumers' records hold once each has every event once: the events'
    numbers and their spaces (the lines' heads aside)."""
    return len(CONSUMERS) * sum(len(str(n)) + 1 for n in range(events))


def _recorded_bytes(records: Path) -> int:
    return sum(path.stat().st_size for name in CONSUMERS for path in record_files(records, name))


def _kill(reader: Engine, work: subprocess.Popen[bytes], rng: random.Random) -> int:
    """SIGKILL a worker process chosen at random among those alive and registered (waiting for
    the replacement of one killed before, if none is); its pid."""
    deadline = time.monotonic() + REPLACEMENT_SECONDS
    while not (alive := _live_workers(reader, work)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no live worker to kill after {REPLACEMENT_SECONDS:g} s")
        time.sleep(0.1)
    victim = rng.choice(alive)
    os.kill(victim, signal.SIGKILL)
    return victim


def _tables() -> dict[str, Table]:
    """The buffers sampled, the source first."""
    models = {SOURCE: FanoutEvent, **MODELS}
    return {name: model.__table__ for name, model in models.items()}  # type: ignore[attr-defined]


def _oldest_ages(reader: Engine) -> dict[str, float | None]:
    """Each buffer's oldest event's age in seconds (None: empty), read in this order: the
    source before the consumers, so that a source read empty leaves no copy unseen."""
    with reader.connect() as conn:
        return {name: queries.oldest_event_age(conn, table) for name, table in _tables().items()}


def _empty(ages: dict[str, float | None], *names: str) -> bool:
    return all(ages[name] is None for name in names)


# --- what the run measured ----------------------------------------------------------------------


def _count(records: Path, events: int, proof: Proof) -> None:
    """Each consumer's records against the events written: handed, distinct, lost, duplicated,
    numbers that were never written, calls that returned and that raised, those past their
    group's first attempt and the most attempts, those before the paused consumer was resumed
    (of the paused consumer: none), when the last call that returned began."""
    for name in CONSUMERS:
        times = [0] * events
        handed = unknown = calls = failed = again = early = 0
        last = 0.0
        attempts = (0, 0.0)  # the most attempts a call that returned was at, and its time
        for words in record_lines(records, name):
            if words[0] == FAILED:
                failed += 1
                continue
            assert words[0] == OK, words[:3]
            calls += 1
            called, attempt = float(words[1]), int(words[2])
            last = max(last, called)
            again += attempt > 1
            attempts = max(attempts, (attempt, called))
            early += called < proof.pause["resume_asked"]
            for word in words[3:]:
                n = int(word)
                handed += 1
                if 0 <= n < events:
                    times[n] += 1
                else:
                    unknown += 1
        distinct = sum(1 for seen in times if seen)
        proof.consumers[name] = {
            "handed": handed,
            "distinct": distinct,
            "lost": events - distinct,
            "duplicates": handed - unknown - distinct,
            "most_times_one_event": max(times, default=0),
            "unknown": unknown,
            "calls": calls,
            "failed_calls": failed,
            # A group's attempt counts when a worker leases it: past the first, a kill took
            # the one before (or, of the failing consumer, mostly its failures).
            "calls_past_first_attempt": again,
            "most_attempts": attempts[0],
            "most_attempts_at": round(attempts[1] - proof.started, 1) if calls else None,
            "calls_before_resume": early,
            # The records' wall clock against the writer's start.
            "last_call_at": round(last - proof.started, 1) if calls else None,
        }


def _ages(samples: list[Sample], proof: Proof) -> None:
    """Per buffer, the sampled oldest age (an empty buffer's is 0): max, when it was seen, p50
    and p95; when the buffer was last seen holding an event."""
    for name in (SOURCE, *CONSUMERS):
        ages = [found[name] or 0.0 for _, found in samples]
        busy = [at for at, found in samples if found[name] is not None]
        highest = max(range(len(ages)), key=ages.__getitem__, default=None)
        most = 0.0 if highest is None else ages[highest]
        summary: dict[str, Any] = {
            "samples": len(ages),
            "max": round(most, 2),
            "max_at": None if highest is None else round(samples[highest][0], 1),
            "p50": round(percentile(ages, 0.5), 2) if ages else 0.0,
            "p95": round(percentile(ages, 0.95), 2) if ages else 0.0,
            "last_busy_at": round(max(busy, default=0.0), 1),
        }
        if name == SOURCE:
            proof.source = {"age": summary}
        else:
            summary["staleness"] = round(most / proof.promise, 3)
            proof.consumers[name]["age"] = summary


def _left(reader: Engine, proof: Proof) -> None:
    """Rows left in each buffer, and dead letters of the run's handlers."""
    with reader.connect() as conn:
        for name, table in _tables().items():
            proof.left[name] = int(
                conn.execute(select(func.count()).select_from(table)).scalar_one()
            )
        archive = schema.archive
        proof.dead_letters = int(
            conn.execute(
                select(func.count())
                .select_from(archive)
                .where(archive.c.status == ArchiveStatus.DEAD)
                .where(archive.c.buffer.in_([t.name for t in _tables().values()]))
            ).scalar_one()
        )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        writer_main(json.loads(sys.argv[2]))
        return
    defaults = Options()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--database", choices=DATABASES, default="postgresql")
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="events a second")
    parser.add_argument("--transaction", type=int, default=defaults.transaction)
    parser.add_argument("--pause", type=float, default=defaults.pause, help="seconds")
    parser.add_argument("--resume-when-healthy-done", action="store_true")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--consumer-batch-size", type=int, default=defaults.consumer_batch_size)
    parser.add_argument("--fail-fraction", type=float, default=defaults.fail_fraction)
    parser.add_argument("--retry-seconds", type=float, default=defaults.retry_seconds)
    parser.add_argument("--limited-calls", type=float, default=defaults.limited_calls)
    parser.add_argument(
        "--limited-concurrency",
        type=int,
        default=defaults.limited_concurrency,
        help="the limited consumer's groups in flight at once (0: no cap)",
    )
    parser.add_argument("--processes", type=int, default=defaults.processes)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--lease", type=float, default=defaults.lease, help="seconds")
    parser.add_argument("--poll-interval", type=float, default=None, help="seconds")
    parser.add_argument("--rescue-interval", type=float, default=None, help="seconds")
    parser.add_argument("--worker-stale-after", type=float, default=None, help="seconds")
    parser.add_argument("--sample-every", type=float, default=defaults.sample_every)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds")
    parser.add_argument(
        "--suffix", default=None, help="appended to the results file's name (fanout_<database>)"
    )
    args = parser.parse_args()
    if args.events < 1 or args.transaction < 1 or args.processes < 2 or args.kills < 0:
        parser.error("--events ≥ 1, --transaction ≥ 1, --processes ≥ 2, --kills ≥ 0")
    if not 0 <= args.fail_fraction < 1:
        parser.error("--fail-fraction: a fraction from 0 up to (not including) 1")
    options = Options(**{k: v for k, v in vars(args).items() if k not in ("database", "suffix")})
    print(f"{args.database}: {options.events:,} events fanned out to four consumers", flush=True)
    with scratch(args.database, "fanout") as url:
        proof = prove(url, options, log=lambda line: print(line, flush=True))
    data = {
        "benchmark": "fanout",
        "command": command_line("benchmarks.fanout", args),
        "machine": machine(),
        "options": asdict(options),
        **asdict(proof),
        "lost": proof.lost,
    }
    print(json.dumps({k: v for k, v in data.items() if k != "kills"}, indent=2), flush=True)
    name = f"fanout_{proof.database}{args.suffix or ''}"
    print(f"written to {write(name, data)}", flush=True)
    if any(proof.lost.values()) or any(proof.left.values()) or proof.dead_letters:
        raise SystemExit(f"{args.database}: lost {proof.lost}, left {proof.left}")


if __name__ == "__main__":
    main()
