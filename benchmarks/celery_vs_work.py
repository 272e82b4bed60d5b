"""The Celery executor against ``outbox work``: recovery after a kill, and group sizes.

In one run, on this machine's PostgreSQL and a broker, the same application
(:mod:`benchmarks.celery_app`: one handler taking ``--handler-seconds`` a call, batch
``--batch-size``, outbox's settings at their defaults) runs under each executor in turn, with
as many worker processes each:

- Celery: ``celery worker --pool prefork --concurrency P`` (one task at a time in each of P
  children) and one ``celery beat``;
- ``outbox work --processes P --concurrency 1`` (one job at a time in each of P children).

For each: (1) groups: a producer commits ``--rate`` events a second (ten transactions a
second) for ``--load-seconds``, then the buffer drains; the events of each handler call are
its group's size. (2) recovery: ``--kills`` times, a round of events is committed, the child
that begins a group is SIGKILLed halfway through the call, and the seconds from the kill until
another child begins that group again are its recovery. The figures are the ratios
Celery / ``outbox work``: recovery (the target: ≤ 1, no slower) and mean group size (the
target: ≥ 1, no smaller).

    python -m benchmarks.celery_vs_work --kills 3 --load-seconds 20 --rate 200
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Engine, create_engine, func, select

from benchmarks._common import (
    REPOSITORY,
    command_line,
    drop_database,
    fresh_tables,
    machine,
    scratch_database,
    write,
)
from outbox import add_events, schema

DATABASE = "outbox_bench_celery_vs_work"
WAIT_SECONDS = 180.0


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the handler, as recorded."""

    kind: str
    group: str
    attempt: int
    pid: int
    at: float
    events: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.group, self.attempt, self.pid)


def read_calls(directory: Path) -> list[Call]:
    """Every call recorded so far, starts and ends, in time order."""
    calls = []
    for path in directory.glob("record-*.log"):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                kind, group, attempt, pid, at, events = line.split()
                calls.append(Call(kind, group, int(attempt), int(pid), float(at), int(events)))
    return sorted(calls, key=lambda c: c.at)


def children(pid: int) -> set[int]:
    """The live child processes of ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
            if int(parent) == pid and state != "Z":
                found.add(int(entry.name))
    return found


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    """Poll ``condition`` until truthy; its value. RuntimeError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return value


class Executor:
    """The processes of one executor, started in a directory of their own."""

    def __init__(self, name: str, args: argparse.Namespace, url: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        self.records = directory / "records"
        self.records.mkdir(parents=True)
        queue = f"outbox-bench-{uuid.uuid4().hex[:8]}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")},
            "OUTBOX_DATABASE_URL": url,
            "BENCH_CELERY_BROKER_URL": args.broker,
            "BENCH_CELERY_QUEUE": queue,
            "BENCH_BATCH_SIZE": str(args.batch_size),
            "BENCH_HANDLER_SECONDS": str(args.handler_seconds),
            "BENCH_RECORD_DIR": str(self.records),
        }
        celery = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_app:celery"]
        if name == "celery":
            commands = {
                "worker": [*celery, "worker", "--pool", "prefork", "--loglevel", "WARNING",
                           "--concurrency", str(args.processes),
                           "--prefetch-multiplier", str(args.prefetch_multiplier),
                           "--queues", f"{queue},{queue}-app", "--without-gossip",
                           "--without-mingle", "--without-heartbeat"],
                "beat": [*celery, "beat", "--loglevel", "WARNING",
                         "--schedule", str(directory / "beat.schedule"),
                         "--pidfile", str(directory / "beat.pid")],
            }  # fmt: skip
        else:
            commands = {
                "worker": [sys.executable, "-m", "outbox", "--app", "benchmarks.celery_app:outbox",
                           "work", "--processes", str(args.processes), "--concurrency", "1"],
            }  # fmt: skip
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for role, command in commands.items():
            with (directory / f"{role}.log").open("wb") as log:
                self.processes[role] = subprocess.Popen(
                    command, cwd=REPOSITORY, env=self.env, stdout=log, stderr=subprocess.STDOUT
                )
        self.queues = (queue, f"{queue}-app")
        self.broker = args.broker

    def pool(self) -> set[int]:
        """The worker's children now."""
        return children(self.processes["worker"].pid)

    def stop(self) -> None:
        """Stop every process (and any child left), and delete the queues."""
        left = self.pool()
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.name == "celery":
            from kombu import Connection

            with Connection(self.broker) as conn:
                for queue in self.queues:
                    try:
                        conn.default_channel.queue_delete(queue)
                    except Exception:  # noqa: S112 - a queue never declared is not there
                        continue


def commit(engine: Engine, count: int) -> None:
    """Commit ``count`` events in one transaction."""
    from benchmarks.celery_app import CeleryBenchEvent

    with engine.begin() as conn:
        add_events(conn, CeleryBenchEvent, [{"note": "bench"} for _ in range(count)])


def drained(engine: Engine) -> bool:
    """True when the buffer and the job table are both empty."""
    from benchmarks.celery_app import CeleryBenchEvent

    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(CeleryBenchEvent.__table__))
        jobs = conn.execute(select(func.count()).select_from(schema.jobs))
        return rows.scalar_one() == 0 and jobs.scalar_one() == 0


def groups(executor: Executor, engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """Events per handler call while a producer commits ``--rate`` events a second."""
    began = time.time()
    per = max(args.rate // 10, 1)
    stop = threading.Event()

    def produce() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            commit(engine, per)
            next_at += 0.1
            time.sleep(max(next_at - time.monotonic(), 0))

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(args.load_seconds)
    stop.set()
    producer.join()
    wait_for(lambda: drained(engine), "the load's drain")
    sizes = [c.events for c in read_calls(executor.records) if c.kind == "start" and c.at >= began]
    return {
        "calls": len(sizes),
        "events": sum(sizes),
        "mean_events_per_call": round(statistics.fmean(sizes), 1),
        "median_events_per_call": statistics.median(sizes),
        "seconds": round(time.time() - began, 1),
    }


def recoveries(executor: Executor, engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """Seconds from a SIGKILL mid-call until another child begins the killed group again."""
    seconds = []
    for _ in range(args.kills):
        commit(engine, args.batch_size * 2)

        def fresh() -> list[Call]:
            pool, now = executor.pool(), time.time()
            calls = read_calls(executor.records)
            ended = {c.key for c in calls if c.kind == "end"}
            return [
                c
                for c in calls
                if c.kind == "start" and c.pid in pool and c.key not in ended
                and now - c.at < args.handler_seconds / 4
            ]  # fmt: skip

        call = wait_for(fresh, "a call begun in a child")[-1]
        time.sleep(max(call.at + args.handler_seconds / 2 - time.time(), 0))
        killed_at = time.time()
        os.kill(call.pid, signal.SIGKILL)
        again = wait_for(
            lambda: [
                c
                for c in read_calls(executor.records)
                if c.kind == "start" and c.group == call.group and c.at > killed_at  # noqa: B023
            ],
            f"group {call.group} begun again",
        )[0]
        seconds.append(again.at - killed_at)
        wait_for(lambda: drained(engine), "the drain after a kill")
    return {
        "kills": len(seconds),
        "seconds": [round(s, 2) for s in seconds],
        "median_seconds": round(statistics.median(seconds), 2),
        "max_seconds": round(max(seconds), 2),
    }


def measure(name: str, args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Groups, then recoveries, under one executor, on fresh tables."""
    from benchmarks.celery_app import Base

    fresh_tables(url, Base.metadata)
    engine = create_engine(url)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as directory:
        executor = Executor(name, args, url, Path(directory))
        try:
            wait_for(lambda: len(executor.pool()) >= args.processes, f"{name}'s processes")
            result = {
                "groups": groups(executor, engine, args),
                "recovery": recoveries(executor, engine, args),
            }
        finally:
            executor.stop()
    engine.dispose()
    print(name, result, flush=True)
    return result


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--prefetch-multiplier", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--handler-seconds", type=float, default=0.5)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    url = scratch_database(DATABASE)
    try:
        results = {name: measure(name, args, url) for name in ("celery", "work")}
    finally:
        drop_database(DATABASE)
    celery, work = results["celery"], results["work"]
    ratios = {
        "recovery_median": round(
            celery["recovery"]["median_seconds"] / work["recovery"]["median_seconds"], 2
        ),
        "recovery_max": round(
            celery["recovery"]["max_seconds"] / work["recovery"]["max_seconds"], 2
        ),
        "mean_group_size": round(
            celery["groups"]["mean_events_per_call"] / work["groups"]["mean_events_per_call"], 2
        ),
    }
    data = {
        "benchmark": "celery_vs_work",
        "command": command_line("benchmarks.celery_vs_work", args),
        "machine": machine(),
        "celery": celery,
        "work": work,
        "ratios_celery_over_work": ratios,
        "targets_met": {
            "recovery_no_slower": ratios["recovery_median"] <= 1.0,
            "groups_no_smaller": ratios["mean_group_size"] >= 1.0,
        },
    }
    print(ratios, data["targets_met"], sep="\n")
    print(f"results in {write('celery_vs_work', data)}")


if __name__ == "__main__":
    main()
