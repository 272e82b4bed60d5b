"""The chaos run: producers and a fleet of workers under seeded faults, then the checker.

    python -m tests.faults.chaos --seed 7 --duration 30 --events 3000

starts a private PostgreSQL cluster, producer threads that write events in application
transactions (about one in ten rolled back), several ``outbox work`` processes that also
distribute (``--distribute-every``), and injects faults at seeded random times during the fault
window (``--duration`` seconds):

- ``worker_kill``: SIGKILL a worker, start a new one in its place a moment later;
- ``connection_kill``: ``pg_terminate_backend`` the connections of one worker (every third
  time: of every client, producers included);
- ``db_restart_immediate`` / ``db_restart_fast``: restart PostgreSQL, by crashing it (with a
  random down time) or cleanly, in turn;
- ``zombie_pause``: SIGSTOP a worker for longer than its lease, then SIGCONT: it wakes after its
  groups were rescued by others.

Then the faults stop, paused workers resume, dead ones are replaced, producers finish their
events, and the run waits for the outbox to drain, stops the workers with SIGTERM and runs the
checker (``tests/faults/_checker.py``). Throughout, it watches how long each job lease stays
held: one held longer than the longest outage plus five leases (at least 30 s) is a group stuck
with a worker that no longer works on it. It prints the seed, the faults injected, the
checker's counts and the time to drain, and exits 1 when an invariant is violated, a lease got
stuck, a running worker exited by itself, a worker did not stop cleanly, or the outbox did not
drain.

The same seed gives the same fault schedule (kinds, times, targets); what the processes happen
to be doing when a fault lands still varies from run to run.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, select
from sqlalchemy.exc import DBAPIError

from outbox import schema
from tests.faults._checker import Report, check
from tests.faults._cluster import ClusterUnavailableError, PrivateCluster
from tests.faults._processes import OutboxProcess, drained
from tests.faults._workload import Ledger, Producer, create_tables
from tests.faults.fault_app import BATCH_SIZE_ENV, HANDLER_SECONDS_ENV

WORKER_KILL = "worker_kill"
CONNECTION_KILL = "connection_kill"
DB_RESTART_IMMEDIATE = "db_restart_immediate"
DB_RESTART_FAST = "db_restart_fast"
ZOMBIE_PAUSE = "zombie_pause"
FAULT_KINDS = (WORKER_KILL, CONNECTION_KILL, DB_RESTART_IMMEDIATE, DB_RESTART_FAST, ZOMBIE_PAUSE)

TICK_SECONDS = 0.05
WORKER_APPLICATION = "fault-worker-{slot}"
PRODUCER_APPLICATION = "fault-producer"
CHECKER_APPLICATION = "fault-checker"
MIN_STUCK_LEASE_SECONDS = 30.0
MAX_DOWN_SECONDS = 8.0
"""An immediate restart keeps the database down up to this long: longer than a lease."""
STOP_TIMEOUT_SECONDS = 30.0
BUSY_TARGET_RATIO = 0.8


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run. Fault counts left at None scale with the duration."""

    seed: int
    duration: float = 30.0
    """Seconds of the fault window."""
    events: int = 3000
    """Committed events the producers write in all."""
    workers: int = 3
    concurrency: int = 4
    producers: int = 2
    batch_size: int = 25
    handler_seconds: float = 0.5
    """How long each batch takes: long enough that faults land inside handlers."""
    lease: float = 4.0
    distribute_every: float = 1.0
    worker_kills: int | None = None
    connection_kills: int | None = None
    db_restarts: int | None = None
    zombie_pauses: int | None = None
    drain_timeout: float = 300.0

    def fault_counts(self) -> dict[str, int]:
        """How many faults of each kind the run injects."""
        d = self.duration

        def given_or(value: int | None, scaled: int) -> int:
            return value if value is not None else scaled

        restarts = given_or(self.db_restarts, max(2, int(d // 100)))
        return {
            WORKER_KILL: given_or(self.worker_kills, max(3, int(d // 12))),
            CONNECTION_KILL: given_or(self.connection_kills, max(2, int(d // 30))),
            DB_RESTART_IMMEDIATE: (restarts + 1) // 2,
            DB_RESTART_FAST: restarts // 2,
            ZOMBIE_PAUSE: given_or(self.zombie_pauses, max(1, int(d // 60))),
        }


@dataclass(order=True)
class Action:
    """Something the driver does at ``at`` seconds into the run."""

    at: float
    order: int
    kind: str = field(compare=False)
    slot: int = field(default=-1, compare=False)
    value: float = field(default=0.0, compare=False)
    """Down seconds of an immediate restart."""


def plan(config: ChaosConfig) -> list[Action]:
    """The seeded fault schedule: each fault at a uniform random time inside the window."""
    rng = random.Random(config.seed)
    margin = min(2.0, config.duration / 10)
    actions: list[Action] = []
    for kind, count in config.fault_counts().items():
        for _ in range(count):
            at = rng.uniform(margin, config.duration - margin)
            down = rng.uniform(0, MAX_DOWN_SECONDS) if kind == DB_RESTART_IMMEDIATE else 0.0
            actions.append(Action(at, 0, kind, rng.randrange(config.workers), down))
    actions.sort()
    return [Action(a.at, n, a.kind, a.slot, a.value) for n, a in enumerate(actions)]


class LeaseWatch:
    """How long each lease (a job's id and token) stays held, as seen from outside.

    A job is leased by one worker for one attempt; the lease goes when the job finishes, is
    rescued after its worker died or stalled, or is released for a retry. A lease held far
    longer than a batch, the lease and the longest outage together means a group stuck with a
    live worker that no longer works on it: "nothing stays claimed forever" is broken.
    """

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.longest = 0.0
        self.stuck: set[tuple[int, str]] = set()
        self._first_seen: dict[tuple[int, str], float] = {}
        self._next = 0.0

    def poll(self, engine: Engine) -> None:
        """Look at the leases held now (at most once a second; quietly skipped while the
        database is down)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 1.0
        jobs = schema.jobs
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    select(jobs.c.id, jobs.c.lease_token).where(jobs.c.lease_token.is_not(None))
                ).all()
        except DBAPIError:
            return
        held = {(int(job_id), str(token)) for job_id, token in rows}
        for lease in held:
            since = self._first_seen.setdefault(lease, now)
            self.longest = max(self.longest, now - since)
            if now - since > self.threshold:
                self.stuck.add(lease)
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in held}


@dataclass
class ChaosResult:
    """What a chaos run did and found."""

    seed: int
    config: dict[str, Any]
    faults: dict[str, int]
    report: Report
    committed: int
    rolled_back: int
    indeterminate: int
    drain_seconds: float | None
    run_seconds: float
    unexpected_exits: list[str]
    startup_failures: int
    unclean_stops: list[str]
    longest_lease_seconds: float
    stuck_leases: int
    workdir: str

    @property
    def failures(self) -> dict[str, Any]:
        """Everything that makes the run fail; empty when it passed."""
        failures: dict[str, Any] = dict(self.report.violations)
        if self.drain_seconds is None:
            failures["not_drained"] = True
        if self.unexpected_exits:
            failures["unexpected_exits"] = self.unexpected_exits
        if self.unclean_stops:
            failures["unclean_stops"] = self.unclean_stops
        if self.stuck_leases:
            failures["stuck_leases"] = self.stuck_leases
        return failures

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        data = asdict(self)
        data["failures"] = self.failures
        return data


class Fleet:
    """The worker processes, one per slot; a slot whose worker died gets a new one."""

    def __init__(self, config: ChaosConfig, cluster: PrivateCluster, database: str, workdir: Path):
        self.config = config
        self.cluster = cluster
        self.database = database
        self.handled_dir = workdir / "handled"
        self.log_dir = workdir / "logs"
        self.handled_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[OutboxProcess | None] = [None] * config.workers
        self.generations = [0] * config.workers
        self.killed: set[int] = set()
        """pids the driver killed itself."""
        self.unexpected_exits: list[str] = []
        self.startup_failures = 0

    def spawn(self, slot: int) -> None:
        """Start a worker in ``slot``."""
        self.generations[slot] += 1
        url = self.cluster.url(self.database, WORKER_APPLICATION.format(slot=slot))
        c = self.config
        args = [
            "work",
            "--concurrency", str(c.concurrency),
            "--lease", str(c.lease),
            "--poll-interval", "0.2",
            "--distribute-every", str(c.distribute_every),
            "--shutdown-grace-period", "15",
        ]  # fmt: skip
        self.workers[slot] = OutboxProcess(
            f"worker-{slot}-{self.generations[slot]}",
            url,
            args,
            handled_dir=self.handled_dir,
            log_dir=self.log_dir,
            env={BATCH_SIZE_ENV: str(c.batch_size), HANDLER_SECONDS_ENV: str(c.handler_seconds)},
        )

    def alive(self, slot: int) -> OutboxProcess | None:
        """The worker of ``slot`` if it runs and is not paused."""
        worker = self.workers[slot]
        return worker if worker is not None and worker.alive() and not worker.paused else None

    def watch(self) -> list[int]:
        """Find workers that exited without being killed; the slots that need a new worker."""
        empty = []
        for slot, worker in enumerate(self.workers):
            if worker is None:
                empty.append(slot)
                continue
            code = worker.popen.poll()
            if code is None:
                continue
            if worker.pid not in self.killed:
                stderr = worker.stderr()
                if "outbox.worker.started" in stderr:
                    tail = " | ".join(stderr.strip().splitlines()[-3:])[-1500:]
                    self.unexpected_exits.append(f"{worker.name} exited {code}: {tail}")
                else:
                    # It could not start (the database was down at that moment): exit code 3
                    # or 1 by design, not a running worker giving up.
                    self.startup_failures += 1
            self.workers[slot] = None
            empty.append(slot)
        return empty

    def kill(self, slot: int) -> bool:
        """SIGKILL the worker of ``slot``; False when none runs there."""
        worker = self.alive(slot)
        if worker is None:
            return False
        self.killed.add(worker.pid)
        worker.kill()
        self.workers[slot] = None
        return True

    def stop_all(self) -> list[str]:
        """SIGTERM every worker; the names of those that did not exit 0."""
        unclean = []
        for worker in self.workers:
            if worker is None:
                continue
            code = worker.stop(timeout=STOP_TIMEOUT_SECONDS)
            if code != 0:
                unclean.append(f"{worker.name} exited {code}")
        self.workers = [None] * self.config.workers
        return unclean


def run(
    config: ChaosConfig,
    *,
    cluster: PrivateCluster | None = None,
    workdir: Path | None = None,
    out: Callable[[str], None] = print,
) -> ChaosResult:
    """Run one chaos run; the caller decides what its result means."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="outbox-chaos-"))
    own_cluster = cluster is None
    if cluster is None:
        cluster = PrivateCluster()
        cluster.start()
    database = f"chaos_{config.seed}_{int(time.time())}"
    out(
        f"chaos: seed={config.seed} duration={config.duration:g}s events={config.events} "
        f"workers={config.workers}x{config.concurrency} batch_size={config.batch_size} "
        f"lease={config.lease:g}s workdir={workdir}"
    )
    fleet: Fleet | None = None
    producers: list[Producer] = []
    try:
        cluster.create_database(database)
        url = cluster.url(database)
        create_tables(url)
        fleet = Fleet(config, cluster, database, workdir)
        ledger = Ledger()
        schedule = plan(config)
        out("chaos: planned faults " + _counts(Counter(a.kind for a in schedule)))
        started = time.monotonic()
        for slot in range(config.workers):
            fleet.spawn(slot)
        rate = config.events / config.duration / config.producers
        producers = [
            Producer(
                cluster.url(database, PRODUCER_APPLICATION),
                ledger,
                name=f"producer-{n}",
                rate=rate,
                target=config.events,
                seed=config.seed * 1000 + n,
            )
            for n in range(config.producers)
        ]
        for producer in producers:
            producer.start()

        leases = LeaseWatch(max(MIN_STUCK_LEASE_SECONDS, MAX_DOWN_SECONDS + 5 * config.lease))
        injected = _inject(config, cluster, fleet, schedule, started, out, leases)
        window_end = time.monotonic()

        # Faults over: wake the paused, replace the dead, let producers finish at full speed.
        for worker in fleet.workers:
            if worker is not None and worker.paused:
                worker.signal(signal.SIGCONT)
        for slot in fleet.watch():
            fleet.spawn(slot)
        for producer in producers:
            producer.full_speed.set()
        checker = create_engine(
            cluster.url(database, CHECKER_APPLICATION), pool_pre_ping=True, pool_size=1
        )
        for producer in producers:
            while producer.is_alive():
                producer.join(timeout=1)
                for slot in fleet.watch():
                    fleet.spawn(slot)
                leases.poll(checker)
        produced = time.monotonic()
        out(
            f"chaos: faults stopped after {window_end - started:.1f}s, producers done after "
            f"{produced - started:.1f}s: committed={len(ledger.committed)} "
            f"rolled_back={len(ledger.rolled_back)} indeterminate={len(ledger.indeterminate)}"
        )

        drain_seconds: float | None = None
        deadline = produced + config.drain_timeout
        while time.monotonic() < deadline:
            for slot in fleet.watch():
                fleet.spawn(slot)
            leases.poll(checker)
            if drained(checker):
                drain_seconds = time.monotonic() - produced
                break
            time.sleep(0.25)
        fleet.watch()
        unclean = fleet.stop_all()
        report = check(checker, fleet.handled_dir, ledger.rolled_back)
        checker.dispose()
        result = ChaosResult(
            seed=config.seed,
            config=asdict(config),
            faults=dict(injected),
            report=report,
            committed=len(ledger.committed),
            rolled_back=len(ledger.rolled_back),
            indeterminate=len(ledger.indeterminate),
            drain_seconds=drain_seconds,
            run_seconds=time.monotonic() - started,
            unexpected_exits=fleet.unexpected_exits,
            startup_failures=fleet.startup_failures,
            unclean_stops=unclean,
            longest_lease_seconds=round(leases.longest, 1),
            stuck_leases=len(leases.stuck),
            workdir=str(workdir),
        )
        (workdir / "result.json").write_text(json.dumps(result.as_dict(), indent=2, default=str))
        _print_result(result, out)
        return result
    finally:
        for producer in producers:
            producer.stopping.set()
        if fleet is not None:
            for worker in fleet.workers:
                if worker is not None:
                    worker.kill()
        for producer in producers:
            producer.join(timeout=10)
        if own_cluster:
            cluster.stop()
        else:
            try:
                cluster.drop_database(database)
            except Exception as error:  # the result matters more than the clean-up
                out(f"chaos: could not drop {database}: {error}")


def _inject(
    config: ChaosConfig,
    cluster: PrivateCluster,
    fleet: Fleet,
    schedule: list[Action],
    started: float,
    out: Callable[[str], None],
    leases: LeaseWatch,
) -> Counter[str]:
    """Carry out the schedule, and its follow-ups (respawns, resumes), until the window ends."""
    rng = random.Random(config.seed + 1)
    engine = create_engine(
        cluster.url(fleet.database, CHECKER_APPLICATION), pool_pre_ping=True, pool_size=1
    )
    try:
        return _carry_out(config, cluster, fleet, schedule, started, out, rng, engine, leases)
    finally:
        engine.dispose()


def _carry_out(
    config: ChaosConfig,
    cluster: PrivateCluster,
    fleet: Fleet,
    schedule: list[Action],
    started: float,
    out: Callable[[str], None],
    rng: random.Random,
    engine: Engine,
    leases: LeaseWatch,
) -> Counter[str]:
    injected: Counter[str] = Counter()
    pending = list(schedule)
    heapq.heapify(pending)
    order = len(schedule)
    while True:
        now = time.monotonic() - started
        for empty in fleet.watch():
            if not any(a.kind == "respawn" and a.slot == empty for a in pending):
                fleet.spawn(empty)
        leases.poll(engine)
        if now >= config.duration and not pending:
            return injected
        if not pending or pending[0].at > now:
            time.sleep(TICK_SECONDS)
            continue
        action = heapq.heappop(pending)
        follow_up: Action | None = None
        done = False
        slot: int | None = action.slot
        try:
            if action.kind == WORKER_KILL:
                slot = _pick(fleet, action.slot, rng, engine)
                if slot is not None and fleet.kill(slot):
                    done = True
                    follow_up = Action(now + rng.uniform(0.2, 2.0), order, "respawn", slot)
            elif action.kind == CONNECTION_KILL:
                if injected[CONNECTION_KILL] % 3 == 2:
                    cluster.terminate()
                else:
                    cluster.terminate(WORKER_APPLICATION.format(slot=action.slot))
                done = True
            elif action.kind == DB_RESTART_IMMEDIATE:
                cluster.restart_immediate(down_seconds=action.value)
                done = True
            elif action.kind == DB_RESTART_FAST:
                cluster.restart_fast()
                done = True
            elif action.kind == ZOMBIE_PAUSE:
                slot = _pick(fleet, action.slot, rng, engine)
                worker = fleet.alive(slot) if slot is not None else None
                if slot is not None and worker is not None:
                    worker.signal(signal.SIGSTOP)
                    done = True
                    resume = now + config.lease + rng.uniform(1.0, 4.0)
                    follow_up = Action(resume, order, "resume", slot)
            elif action.kind == "respawn":
                if fleet.workers[action.slot] is None:
                    fleet.spawn(action.slot)
            elif action.kind == "resume":
                worker = fleet.workers[action.slot]
                if worker is not None:
                    worker.signal(signal.SIGCONT)
        except Exception as error:  # a fault that could not be injected is reported, not fatal
            out(f"chaos: {action.kind} at {now:.1f}s failed: {error}")
        if done:
            injected[action.kind] += 1
            target = "" if action.kind.startswith("db_") else f" worker slot {slot}"
            out(f"chaos: {now:7.2f}s {action.kind}{target}")
        if follow_up is not None:
            order += 1
            heapq.heappush(pending, follow_up)
        if action.kind in FAULT_KINDS and not done and now < config.duration:
            # No worker to hit right now (all dead or paused): try again a little later.
            order += 1
            heapq.heappush(pending, Action(now + 0.5, order, action.kind, action.slot))


def _pick(fleet: Fleet, preferred: int, rng: random.Random, engine: Engine) -> int | None:
    """A running worker to hit: most often one that holds leases right now (a fault inside a
    batch is the one that matters), else the preferred slot, else any running one."""
    running = [s for s in range(len(fleet.workers)) if fleet.alive(s) is not None]
    if not running:
        return None
    if rng.random() < BUSY_TARGET_RATIO:
        busy = _lease_holders(engine)
        candidates = [s for s in running if fleet.workers[s].pid in busy]  # type: ignore[union-attr]
        if candidates:
            return rng.choice(candidates)
    return preferred if preferred in running else rng.choice(running)


def _lease_holders(engine: Engine) -> set[int]:
    """pids of the workers holding a job lease (worker ids are ``host:pid:suffix``)."""
    try:
        with engine.connect() as conn:
            owners = conn.execute(
                select(schema.jobs.c.lease_owner)
                .where(schema.jobs.c.lease_token.is_not(None))
                .distinct()
            ).scalars()
            return {int(owner.rsplit(":", 2)[1]) for owner in owners if owner}
    except DBAPIError:
        return set()


def _counts(counter: Counter[str] | dict[str, int]) -> str:
    return " ".join(f"{kind}={counter.get(kind, 0)}" for kind in FAULT_KINDS)


def _print_result(result: ChaosResult, out: Callable[[str], None]) -> None:
    drain = "never" if result.drain_seconds is None else f"{result.drain_seconds:.1f}s"
    out(f"chaos: seed={result.seed} faults injected: {_counts(result.faults)}")
    out(
        f"chaos: committed={result.committed} rolled_back={result.rolled_back} "
        f"indeterminate={result.indeterminate} time_to_drain={drain} "
        f"run={result.run_seconds:.1f}s startup_failures={result.startup_failures} "
        f"longest_lease={result.longest_lease_seconds:.1f}s stuck_leases={result.stuck_leases}"
    )
    out(f"chaos: checker {result.report.summary()}")
    for line in result.unexpected_exits:
        out(f"chaos: UNEXPECTED EXIT {line}")
    for line in result.unclean_stops:
        out(f"chaos: UNCLEAN STOP {line}")
    verdict = "PASS" if not result.failures else f"FAIL {sorted(result.failures)}"
    out(f"chaos: seed={result.seed} {verdict} (logs in {result.workdir})")


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m tests.faults.chaos --seed S --duration D --events N``."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--duration", type=float, default=30.0, help="fault window, seconds")
    parser.add_argument("--events", type=int, default=3000, help="committed events in all")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--handler-seconds", type=float, default=0.5, help="per batch")
    parser.add_argument("--lease", type=float, default=4.0, help="seconds")
    parser.add_argument("--distribute-every", type=float, default=1.0, help="seconds")
    parser.add_argument("--worker-kills", type=int, default=None)
    parser.add_argument("--connection-kills", type=int, default=None)
    parser.add_argument("--db-restarts", type=int, default=None)
    parser.add_argument("--zombie-pauses", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--workdir", type=Path, default=None, help="logs and result.json")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    config = ChaosConfig(
        seed=seed,
        duration=args.duration,
        events=args.events,
        workers=args.workers,
        concurrency=args.concurrency,
        producers=args.producers,
        batch_size=args.batch_size,
        handler_seconds=args.handler_seconds,
        lease=args.lease,
        distribute_every=args.distribute_every,
        worker_kills=args.worker_kills,
        connection_kills=args.connection_kills,
        db_restarts=args.db_restarts,
        zombie_pauses=args.zombie_pauses,
        drain_timeout=args.drain_timeout,
    )
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(config, workdir=args.workdir, out=lambda line: print(line, flush=True))
    except ClusterUnavailableError as error:
        print(f"chaos: {error}", file=sys.stderr)
        return 2
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
