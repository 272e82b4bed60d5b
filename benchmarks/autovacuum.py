"""Autovacuum on a buffer table: PostgreSQL's defaults against tuned per-table settings.

A buffer is a queue table: a steady stream of inserts, each row updated once by a claim and
deleted soon after, so dead tuples pile up as fast as events arrive (two per event: the version
the claim replaced and the deleted row). Until a vacuum removes them, the dead entries at the
head of the partial index ``ix_bench_events_unclaimed`` are walked by every claim's pick.

Each variant starts from a fresh buffer. One producer thread commits ``--rate`` events a second
in transactions of ``--rows`` rows (one multi-row INSERT each) while one ``outbox work
--concurrency 2 --distribute-every 1 --no-listen`` process drains it, for ``--seconds``; the
worker is then stopped with SIGTERM. Every ``--sample-every`` seconds: live and dead tuples,
autovacuum and autoanalyze counts and the last autovacuum (pg_stat_user_tables), heap and index
sizes, and one probe shaped like the claim's pick (``SELECT id ... WHERE group_id IS NULL ORDER
BY id LIMIT 1000`` under EXPLAIN (ANALYZE, BUFFERS): its execution time and pages touched).

Variants (``--variants``, comma-separated): ``defaults`` (no per-table settings) and
``tuned-N`` (``ALTER TABLE bench_events SET (...)``: vacuum, insert and analyze scale factors 0,
thresholds N, cost delay 0). A suffix ``@S`` runs a variant with ``autovacuum_naptime`` at S
seconds; without it the server's naptime (60 s by default) is kept. The naptime is server-wide
and bounds how often autovacuum looks at any table, whatever the table's own settings.

The run changes server-wide settings with ALTER SYSTEM: ``autovacuum = on`` when the server has
it off (test configurations often do; it cannot be turned on per table), and the naptime of
``@S`` variants. Both are restored (ALTER SYSTEM RESET, pg_reload_conf()) when the run ends,
also when it fails or is stopped with SIGTERM or Ctrl-C. While it runs, autovacuum also visits
the server's other databases.

Every variant runs ``--runs`` times (default 3), round by round; each run is a row of the
results.

    python -m benchmarks.autovacuum --seconds 180 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql

from benchmarks._common import (
    ADMIN_URL,
    command_line,
    libpq_url,
    machine,
    percentile,
    scratch_database,
    write,
)
from benchmarks.drain_throughput import APP, OUTBOX, ROOT, prepare

DEFAULT_VARIANTS = "defaults,tuned-10000,defaults@10,tuned-10000@10"

# The per-table set of a ``tuned-N`` variant. Scale factors 0 make the thresholds absolute, so a
# backlog (many live rows) does not postpone the vacuum; cost delay 0 lets the vacuum run
# unthrottled, since a buffer's dead tuples keep coming while it sleeps.
TUNED = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
)

INSERT = """
INSERT INTO bench_events (account_id, kind)
SELECT a, 'page_view' FROM unnest(%s::integer[]) AS a
"""

STATS = """
SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
       extract(epoch FROM s.last_autovacuum)::float8,
       pg_relation_size('bench_events'), pg_indexes_size('bench_events'),
       pg_relation_size('ix_bench_events_unclaimed'),
       EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = 'bench_events'::regclass)
FROM pg_stat_user_tables AS s WHERE s.relid = 'bench_events'::regclass
"""

# The claim's pick without its lock and its UPDATE: the part that walks the partial index.
PROBE = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT 1000
"""

SERVER = """
SELECT name, setting, coalesce(unit, '') FROM pg_settings
WHERE name LIKE 'autovacuum%' OR name IN ('vacuum_cost_limit', 'server_version')
ORDER BY name
"""

# How far below the target rate the producer may fall before a variant is flagged.
RATE_TOLERANCE = 0.05


@dataclass(frozen=True)
class Variant:
    """Per-table autovacuum settings, and the server-wide naptime to run them with."""

    name: str
    options: dict[str, int]  # reloptions for ALTER TABLE ... SET; empty: PostgreSQL's defaults
    naptime: int | None  # seconds; None: whatever the server has

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """``defaults`` or ``tuned-N``, optionally followed by ``@S`` (naptime in seconds)."""
        base, _, naptime = spec.strip().partition("@")
        if base == "defaults":
            options: dict[str, int] = {}
        elif base.startswith("tuned-") and base[6:].isdigit():
            threshold = int(base[6:])
            options = {name: 0 if "scale" in name or "delay" in name else threshold
                       for name in TUNED}  # fmt: skip
        else:
            raise ValueError(f"unknown variant {spec!r}: defaults or tuned-N, optionally @S")
        return cls(spec.strip(), options, int(naptime) if naptime else None)


class ServerSettings:
    """Server-wide settings changed with ALTER SYSTEM, each put back by :meth:`restore`.

    A setting that came from postgresql.auto.conf is set back to its old value; any other is
    RESET, which removes it from postgresql.auto.conf and lets the configuration files decide
    again. Every change is applied with pg_reload_conf() and waited for: new sessions (the
    autovacuum workers among them) must see it before the measurement goes on.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.original: dict[str, tuple[str, bool]] = {}  # name: (setting, from auto.conf)

    def current(self, name: str) -> tuple[str, bool]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT setting, coalesce(sourcefile LIKE '%%postgresql.auto.conf', false) "
                "FROM pg_settings WHERE name = %s",
                (name,),
            ).fetchone()
        if row is None:
            raise ValueError(f"no server setting {name}")
        return str(row[0]), bool(row[1])

    def set(self, name: str, value: str | None) -> None:
        """Set ``name`` server-wide to ``value`` (in the setting's base unit); None: restore it."""
        if name not in self.original:
            if value is None or self.current(name)[0] == value:
                return  # never changed, nothing to do
            self.original[name] = self.current(name)
        setting, from_auto_conf = self.original[name]
        if value is None and not from_auto_conf:
            statement = sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name))
        else:
            target = setting if value is None else value
            statement = sql.SQL("ALTER SYSTEM SET {} = {}").format(
                sql.Identifier(name), sql.Literal(target)
            )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)
            conn.execute("SELECT pg_reload_conf()")
        self._wait_for(name, setting if value is None else value)
        if value is None:
            del self.original[name]

    def restore(self) -> None:
        """Put back every setting changed, the last change first; a failure stops none."""
        failed: list[BaseException] = []
        for name in reversed(list(self.original)):
            try:
                self.set(name, None)
            except Exception as exc:
                print(f"could not restore {name}: {exc!r}", file=sys.stderr, flush=True)
                failed.append(exc)
        if failed:
            raise failed[0]

    def _wait_for(self, name: str, expected: str) -> None:
        # pg_reload_conf() only signals the postmaster: poll fresh sessions until it has reread.
        deadline = time.monotonic() + 10
        while self.current(name)[0] != expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become {expected!r} after reload")
            time.sleep(0.1)


class Producer(threading.Thread):
    """Commits ``rate`` events a second, ``rows`` per transaction, until stopped.

    On a fixed schedule: transaction k is due at ``k * rows / rate`` seconds; a producer behind
    schedule does not sleep until it has caught up, so short stalls do not lower the rate.
    """

    def __init__(self, dsn: str, rate: float, rows: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.dsn, self.rate, self.rows = dsn, rate, rows
        self.stopping = threading.Event()
        self.produced = 0
        self.elapsed = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                started = time.monotonic()
                transactions = 0
                while not self.stopping.is_set():
                    pause = started + transactions * self.rows / self.rate - time.monotonic()
                    if pause > 0 and self.stopping.wait(pause):
                        break
                    first = self.produced
                    accounts = [(first + i) % 5000 for i in range(self.rows)]
                    conn.execute(INSERT, (accounts,))
                    conn.commit()
                    transactions += 1
                    self.produced += self.rows
                    self.elapsed = time.monotonic() - started
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def sample(dsn: str, started: float, epoch: float) -> dict[str, Any]:
    """One sample of the buffer's statistics, sizes and probe time.

    ``started``: the variant's start on the monotonic clock; ``epoch``: the same moment on the
    server's clock, against which the last autovacuum's time is given.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Each statement is its own transaction: the cumulative statistics are read fresh.
        t = time.monotonic() - started
        stats = conn.execute(STATS).fetchone()
        plan = conn.execute(PROBE).fetchone()
    if stats is None or plan is None:
        raise RuntimeError("bench_events has no statistics")
    live, dead, vacuums, analyzes, vacuumed_at, heap, indexes, unclaimed, vacuuming = stats
    explained = plan[0] if isinstance(plan[0], list) else json.loads(plan[0])
    top = explained[0]
    return {
        "t": round(t, 1),
        "live_tuples": live,
        "dead_tuples": dead,
        "autovacuums": vacuums,
        "autoanalyzes": analyzes,
        "last_autovacuum_at": None if vacuumed_at is None else round(vacuumed_at - epoch, 1),
        "vacuum_in_progress": vacuuming,
        "heap_bytes": heap,
        "index_bytes": indexes,
        "unclaimed_index_bytes": unclaimed,
        "probe_ms": round(top["Execution Time"], 3),
        "probe_buffers": top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"],
        "probe_rows": top["Plan"]["Actual Rows"],
        "probe_plan": _shape(top["Plan"]),
    }


def _shape(node: dict[str, Any]) -> str:
    """A plan as its chain of nodes, e.g. ``Limit > Index Only Scan ix_bench_events_unclaimed``.

    The planner picks the claim's scan from the table's statistics: the partial index while
    the buffer looks large, a sequential scan and a sort once an analyze has seen it small.
    """
    name = str(node["Node Type"])
    if "Index Name" in node:
        name += f" {node['Index Name']}"
    children = node.get("Plans", [])
    return " > ".join([name, *(_shape(child) for child in children)])


def start_worker(url: str) -> subprocess.Popen[bytes]:
    """One long-running worker that distributes too, as a small deployment runs it."""
    command = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning",
               "work", "--concurrency", "2", "--distribute-every", "1", "--no-listen"]  # fmt: skip
    env = {**os.environ, "BENCH_BATCH_SIZE": "1000", "BENCH_ARCHIVE": "0"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def stop_worker(worker: subprocess.Popen[bytes]) -> int:
    """SIGTERM (graceful), then SIGKILL if it has not exited within its grace period."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
    return worker.wait()


def run_variant(
    url: str, dsn: str, variant: Variant, args: argparse.Namespace, server: ServerSettings
) -> dict[str, Any]:
    """One variant on a fresh buffer: stream, drain and sample for ``args.seconds``."""
    prepare(url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if variant.options:
            options = sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(k), sql.Literal(v))
                for k, v in variant.options.items()
            )
            conn.execute(sql.SQL("ALTER TABLE bench_events SET ({})").format(options))
    server.set("autovacuum_naptime", None if variant.naptime is None else str(variant.naptime))
    naptime = int(server.current("autovacuum_naptime")[0])
    worker = start_worker(url)
    producer = Producer(dsn, args.rate, args.rows)
    samples: list[dict[str, Any]] = []
    try:
        producer.start()
        started = time.monotonic()
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        epoch = float(row[0]) if row else 0.0
        next_sample = started
        while True:
            samples.append(sample(dsn, started, epoch))
            if producer.error is not None:
                raise RuntimeError(f"the producer failed: {producer.error!r}")
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}")
            if time.monotonic() - started >= args.seconds:
                break
            next_sample = min(next_sample + args.sample_every, started + args.seconds)
            time.sleep(max(0.0, next_sample - time.monotonic()))
        with psycopg.connect(dsn) as conn:
            backlog = conn.execute("SELECT count(*) FROM bench_events").fetchone()
    finally:
        producer.stopping.set()
        producer.join(timeout=30)
        exit_code = stop_worker(worker)
    if exit_code != 0:
        raise RuntimeError(f"the worker exited with {exit_code} on SIGTERM")
    return summarize(variant, naptime, args, producer, samples, int(backlog[0]) if backlog else 0)


def summarize(
    variant: Variant,
    naptime: int,
    args: argparse.Namespace,
    producer: Producer,
    samples: list[dict[str, Any]],
    backlog: int,
) -> dict[str, Any]:
    last = samples[-1]
    probes = [s["probe_ms"] for s in samples]
    buffers = [float(s["probe_buffers"]) for s in samples]
    runs = sorted({s["last_autovacuum_at"] for s in samples if s["last_autovacuum_at"] is not None})
    rate = producer.produced / producer.elapsed if producer.elapsed else 0.0
    row: dict[str, Any] = {
        "variant": variant.name,
        "table_options": variant.options,
        "naptime_s": naptime,
        "seconds": args.seconds,
        "events_committed": producer.produced,
        "events_per_s": round(rate),
        "rate_short": rate < args.rate * (1 - RATE_TOLERANCE),
        "backlog_at_end": backlog,
        "autovacuum_runs": last["autovacuums"],
        "autoanalyze_runs": last["autoanalyzes"],
        # When each autovacuum seen by a sample finished (seconds into the variant); a run that
        # another overtook between two samples is counted in autovacuum_runs only.
        "autovacuum_at_s": runs,
        "dead_tuples_max": max(s["dead_tuples"] for s in samples),
        "dead_tuples_final": last["dead_tuples"],
        "live_tuples_max": max(s["live_tuples"] for s in samples),
        "heap_bytes_max": max(s["heap_bytes"] for s in samples),
        "heap_bytes_final": last["heap_bytes"],
        "index_bytes_max": max(s["index_bytes"] for s in samples),
        "index_bytes_final": last["index_bytes"],
        "unclaimed_index_bytes_final": last["unclaimed_index_bytes"],
        "probe_ms_p50": round(percentile(probes, 0.5), 3),
        "probe_ms_max": round(max(probes), 3),
        "probe_buffers_p50": round(percentile(buffers, 0.5)),
        "probe_buffers_max": round(max(buffers)),
        "probe_plans": dict(Counter(s["probe_plan"] for s in samples).most_common()),
        "samples": samples,
    }
    if row["rate_short"]:
        print(f"warning: {variant.name}: the producer committed {rate:,.0f} events/s, "
              f"short of {args.rate:,.0f}", flush=True)  # fmt: skip
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    mib = 1024 * 1024
    header = ("variant", "run", "naptime", "events/s", "autovac", "dead max", "dead final",
              "heap MiB", "index MiB", "probe p50", "probe max")  # fmt: skip
    print(" | ".join(header))
    for r in rows:
        print(" | ".join((
            r["variant"], str(r["run"]), f"{r['naptime_s']} s", f"{r['events_per_s']:,}",
            str(r["autovacuum_runs"]), f"{r['dead_tuples_max']:,}", f"{r['dead_tuples_final']:,}",
            f"{r['heap_bytes_final'] / mib:.1f}", f"{r['index_bytes_final'] / mib:.1f}",
            f"{r['probe_ms_p50']:.2f} ms", f"{r['probe_ms_max']:.2f} ms",
        )))  # fmt: skip


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds through the finally blocks: the worker is stopped, settings restored.
    sys.exit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="per variant")
    parser.add_argument("--rate", type=float, default=3000.0, help="events per second")
    parser.add_argument("--rows", type=int, default=20, help="events per transaction")
    parser.add_argument("--sample-every", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--runs", type=int, default=3, help="rounds of every variant")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    variants = [Variant.parse(spec) for spec in args.variants.split(",")]
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    url = scratch_database("outbox_bench_autovacuum")
    dsn = libpq_url(url)
    server = ServerSettings(libpq_url(ADMIN_URL))
    with psycopg.connect(server.dsn) as conn:
        before = {name: f"{setting}{unit}" for name, setting, unit in conn.execute(SERVER)}
    results: dict[str, Any] = {
        "benchmark": "autovacuum",
        "command": command_line("benchmarks.autovacuum", args),
        "machine": machine(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "server_settings_before": before,
        "rate": args.rate,
        "rows_per_transaction": args.rows,
        "seconds_per_variant": args.seconds,
        "runs": args.runs,
        "sample_every_s": args.sample_every,
        "worker": "outbox work --concurrency 2 --distribute-every 1 --no-listen, batch 1,000",
        "rows": [],
    }
    try:
        server.set("autovacuum", "on")
        # Every variant once per round, so that the machine's drift over the minutes a round
        # takes affects all of them alike.
        for run in range(1, args.runs + 1):
            for variant in variants:
                print(f"{variant.name}, run {run} of {args.runs}: {args.seconds:.0f} s at "
                      f"{args.rate:,.0f} events/s", flush=True)  # fmt: skip
                row = {"run": run, **run_variant(url, dsn, variant, args, server)}
                results["rows"].append(row)
                print(f"  {row['autovacuum_runs']} autovacuums, dead tuples max "
                      f"{row['dead_tuples_max']:,}, probe p50 {row['probe_ms_p50']} ms, "
                      f"max {row['probe_ms_max']} ms", flush=True)  # fmt: skip
    finally:
        server.restore()
    print_table(results["rows"])
    print(f"results in {write('autovacuum', results)}")


if __name__ == "__main__":
    main()
