"""An upgrade under load: producers, workers of two releases, migrations, and what they did.

One :class:`Upgrade` per test drives a fresh database through the steps an operator takes:
the older release's ``outbox migrate`` and tables, its workers running while producers write at
a steady rate, the current ``outbox migrate``, the current release's workers, the old ones
stopped, a drain. The producers, the process runner and the checker are the fault tier's
(``tests/faults``); the application is :mod:`tests.upgrade.upgrade_app`, which both releases
can import.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from sqlalchemy import Engine, create_engine, event, func, select

from outbox import schema
from tests._support import wait_for
from tests.acceptance._cli import Result
from tests.faults._checker import Report, check
from tests.faults._processes import OutboxProcess, drained
from tests.faults._workload import Ledger, Producer
from tests.upgrade import upgrade_app
from tests.upgrade._releases import Release
from tests.upgrade.upgrade_app import UpgradeEvent, UpgradeProof

APP = "upgrade_app:app"
CURRENT = "head"
"""The name the current release's processes record their deliveries under."""
# Workers poll often and distribute often, so that the tier's small size moves quickly; the
# lease and the rest are each release's defaults, as users run them.
WORKER_ARGS = ("work", "--distribute-every", "0.5", "--poll-interval", "0.2")
# What every release's worker logs once it works (its signal handlers are in place).
WORKER_STARTED = '"event": "outbox.worker.started"'
WORKER_STOPPED = "outbox.worker.stopped"
COMMAND_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 30.0

Which = Literal["old", "new"]


@dataclass(frozen=True)
class Size:
    """How much an upgrade run does; progress is counted in groups, never waited for by time."""

    name: str
    rate: float
    """Events a second, all producers together."""
    producers: int
    workers: int
    """Workers of each release."""
    groups_before: int
    """Groups the old workers complete before the migration."""
    groups_after: int
    """Groups the old workers complete on the migrated schema before new workers start."""
    groups_mixed: int
    """Groups the new workers complete while the old ones still run."""
    drain_timeout: float
    """Seconds the drain may take once the producers stop, and a wait for groups."""
    reader_seconds: float
    """How long a long reader holds its transaction open during a migration."""
    lock_timeout: float
    """The migration's ``--lock-timeout`` beside a long reader (shorter than the reader)."""


SIZE_ENV = "OUTBOX_UPGRADE_SIZE"
SIZES = {
    # The default test run (README's command).
    "small": Size(
        "small",
        rate=200.0,
        producers=2,
        workers=2,
        groups_before=3,
        groups_after=3,
        groups_mixed=3,
        drain_timeout=60.0,
        reader_seconds=8.0,
        lock_timeout=1.0,
    ),
    # `nox -s upgrade`: more events, longer mixed periods.
    "full": Size(
        "full",
        rate=600.0,
        producers=4,
        workers=3,
        groups_before=100,
        groups_after=300,
        groups_mixed=600,
        drain_timeout=300.0,
        reader_seconds=20.0,
        lock_timeout=5.0,
    ),
}


def size_from_environment() -> Size:
    """The size ``OUTBOX_UPGRADE_SIZE`` names (``small`` by default)."""
    name = os.environ.get(SIZE_ENV, "small")
    if name not in SIZES:
        raise ValueError(f"{SIZE_ENV}={name!r}: expected one of {', '.join(SIZES)}")
    return SIZES[name]


class Delivery(NamedTuple):
    """One line of a handled file: an event delivered by a batch."""

    event_key: int
    group_id: str
    attempt: int
    pid: int
    release: str
    started: float
    """Unix time the batch started."""


class DeliveryLog:
    """The handled files of every worker, read as they grow (complete lines only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self.deliveries: list[Delivery] = []

    def read(self) -> list[Delivery]:
        """Every delivery so far, in the order of the files and their lines."""
        for path in sorted(self.directory.glob("handled-*.log")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            complete = data.rfind(b"\n") + 1  # the part after the last newline may be torn
            self._offsets[path] = offset + complete
            for line in data[:complete].decode().splitlines():
                key, group, attempt, pid, release, started = line.split()
                self.deliveries.append(
                    Delivery(int(key), group, int(attempt), int(pid), release, float(started))
                )
        return self.deliveries

    def groups(self, accept: Callable[[Delivery], bool] = lambda d: True) -> set[str]:
        """The groups with a delivery that ``accept`` accepts."""
        return {d.group_id for d in self.read() if accept(d)}


def longest_gap(starts: Iterable[float], since: float, until: float) -> float:
    """The longest time between ``since`` and ``until`` in which no batch started."""
    times = sorted({since, until, *(s for s in starts if since < s < until)})
    return max(b - a for a, b in itertools.pairwise(times))


class LongReader(threading.Thread):
    """A transaction that has read ``outbox_jobs`` and stays open ``seconds`` (or until
    :meth:`close`), as a report or a console session left open does."""

    def __init__(self, engine: Engine, seconds: float) -> None:
        super().__init__(name="long-reader", daemon=True)
        self.engine = engine
        self.seconds = seconds
        self.reading = threading.Event()
        self.closing = threading.Event()

    def run(self) -> None:
        with self.engine.connect() as conn, conn.begin():
            conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
            self.reading.set()
            self.closing.wait(self.seconds)  # the reader's own time, not a wait for the test

    def close(self) -> None:
        """End the transaction now, if it is still open."""
        self.closing.set()
        self.join(timeout=STOP_TIMEOUT_SECONDS)


def session_time_zone(engine: Engine, zone: str) -> None:
    """Give every new connection of ``engine`` the session time zone ``zone`` (MariaDB)."""

    @event.listens_for(engine, "connect")
    def _set(dbapi_connection: object, connection_record: object) -> None:
        upgrade_app.set_session_time_zone(dbapi_connection, zone)


class Upgrade:
    """One database upgraded under load from ``release`` to this checkout's outbox.

    Keeps every process and producer it starts; :meth:`close` stops what is left.
    """

    def __init__(
        self, url: str, release: Release, workdir: Path, size: Size, zone: str | None = None
    ) -> None:
        self.url = url
        self.release = release
        self.size = size
        self.zone = zone
        # The application alone in a directory: the older release imports it from there.
        self.app_dir = workdir / "app"
        self.handled_dir = workdir / "handled"
        self.log_dir = workdir / "logs"
        for directory in (self.app_dir, self.handled_dir, self.log_dir):
            directory.mkdir()
        shutil.copy(Path(upgrade_app.__file__), self.app_dir / "upgrade_app.py")
        self.engine = create_engine(url)
        if zone is not None:
            session_time_zone(self.engine, zone)
        self.ledger = Ledger()
        self.log = DeliveryLog(self.handled_dir)
        self.producers: list[Producer] = []
        self.processes: list[OutboxProcess] = []
        self.workers: dict[Which, list[OutboxProcess]] = {"old": [], "new": []}

    # --- commands -----------------------------------------------------------------------

    def start(self, which: Which, name: str, *args: str) -> OutboxProcess:
        """Start an ``outbox`` command of the old release or of this checkout."""
        env = {upgrade_app.RELEASE_ENV: self.release.name if which == "old" else CURRENT}
        if self.zone is not None:
            env[upgrade_app.SESSION_TIME_ZONE_ENV] = self.zone
        release = (
            {"program": (str(self.release.outbox),), "base_env": self.release.environment()}
            if which == "old"
            else {}
        )
        process = OutboxProcess(
            name,
            self.url,
            list(args),
            handled_dir=self.handled_dir,
            log_dir=self.log_dir,
            env=env,
            app=APP,
            cwd=self.app_dir,
            **release,
        )
        self.processes.append(process)
        return process

    def run(
        self, which: Which, name: str, *args: str, timeout: float = COMMAND_TIMEOUT_SECONDS
    ) -> Result:
        """Run an ``outbox`` command to its end; how it ended."""
        process = self.start(which, name, *args)
        try:
            code = process.wait(timeout)
        finally:
            process.kill()
        return Result(code, process.stdout(), process.stderr())

    def prepare(self) -> None:
        """The database as the older release left it: its ``outbox migrate``, and the
        application's tables created with its code (on MariaDB, its clock's defaults)."""
        migrated = self.run("old", "migrate-old", "migrate")
        assert 0 == migrated.code, migrated.output
        env = self.release.environment()
        if self.zone is not None:
            env[upgrade_app.SESSION_TIME_ZONE_ENV] = self.zone
        created = subprocess.run(
            [str(self.release.python), "upgrade_app.py", "create-tables", self.url],
            cwd=self.app_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
        assert 0 == created.returncode, created.stderr

    def start_workers(self, which: Which, *options: str) -> list[OutboxProcess]:
        """Start the size's number of ``outbox work`` processes of one release, with
        ``options``, and wait until each has started working (before that, a SIGTERM ends it
        without its shutdown)."""
        started = [
            self.start(
                which, f"{which}-worker-{len(self.workers[which]) + i}", *WORKER_ARGS, *options
            )
            for i in range(self.size.workers)
        ]
        self.workers[which].extend(started)
        for process in started:
            wait_for(
                lambda p=process: WORKER_STARTED in p.stderr() or not p.alive(),
                f"{process.name} to start",
            )
            assert process.alive(), f"{process.name} exited: {process.stderr()}"
        return started

    def stop_workers(self, which: Which) -> list[int]:
        """SIGTERM the running workers of one release and wait for them; their exit codes."""
        running = [process for process in self.workers[which] if process.alive()]
        for process in running:  # all at once; a second SIGTERM would abandon their work
            process.signal(signal.SIGTERM)
        return [process.wait(STOP_TIMEOUT_SECONDS) for process in running]

    def leases_lost(self, which: Which) -> list[int]:
        """The leases each stopped worker of one release says it lost (its last log line)."""
        lost = []
        for process in self.workers[which]:
            for line in process.stderr().splitlines():
                record = json.loads(line) if line.startswith("{") else {}
                if record.get("event") == WORKER_STOPPED:
                    lost.append(int(record["leases_lost"]))
        return lost

    def registered_pids(self) -> set[int]:
        """The process ids of the workers ``outbox_workers`` holds: the fleet as it knows it."""
        with self.engine.connect() as conn:
            return set(conn.execute(select(schema.workers.c.pid)).scalars())

    def pids(self, which: Which) -> set[int]:
        """The process ids of the workers of one release."""
        return {process.pid for process in self.workers[which]}

    def old_deliveries(self, since: float = 0.0) -> Callable[[Delivery], bool]:
        """Accepts the deliveries of the old release's workers that started after ``since``."""
        return lambda d: d.release == self.release.name and d.started > since

    def new_deliveries(self, since: float = 0.0) -> Callable[[Delivery], bool]:
        """Accepts the deliveries of the current release's workers that started after
        ``since``."""
        return lambda d: d.release == CURRENT and d.started > since

    def mixed_period(self) -> None:
        """Up to a fleet of both releases, the database migrated under load: the old release's
        schema and workers, producers, the current ``outbox migrate``, the old workers' groups on
        the migrated schema, then the current workers' groups beside theirs."""
        self.prepare()
        self.start_producers()
        self.start_workers("old")
        self.wait_groups(self.size.groups_before, "the old workers' groups", self.old_deliveries())
        migrated = self.run("new", "migrate", "migrate")
        migrated_at = time.time()
        assert 0 == migrated.code, migrated.output
        self.wait_groups(
            self.size.groups_after,
            "the old workers' groups on the migrated schema",
            self.old_deliveries(migrated_at),
        )
        self.start_workers("new")
        self.wait_groups(self.size.groups_mixed, "the new workers' groups", self.new_deliveries())

    # --- producers ----------------------------------------------------------------------

    def start_producers(self) -> None:
        """Producers writing events and their proof rows at the size's steady rate."""
        for n in range(self.size.producers):
            producer = Producer(
                self.url,
                self.ledger,
                name=f"producer-{n}",
                rate=self.size.rate / self.size.producers,
                target=10**9,  # they write until stopped
                seed=n,
                event_model=UpgradeEvent,
                proof_model=UpgradeProof,
            )
            if self.zone is not None:
                session_time_zone(producer.engine, self.zone)
            producer.start()
            self.producers.append(producer)

    def stop_producers(self) -> None:
        """Stop the producers and wait for their last transactions."""
        for producer in self.producers:
            producer.stopping.set()
        for producer in self.producers:
            producer.join(timeout=STOP_TIMEOUT_SECONDS)

    # --- progress and the outcome -------------------------------------------------------

    def wait_groups(self, count: int, what: str, accept: Callable[[Delivery], bool]) -> None:
        """Wait until ``count`` groups have a delivery ``accept`` accepts (as long as a drain
        may take, at most)."""
        wait_for(
            lambda: len(self.log.groups(accept)) >= count, what, timeout=self.size.drain_timeout
        )

    def drain(self) -> None:
        """Stop the producers and wait until the buffer and the job table are empty."""
        self.stop_producers()
        wait_for(
            lambda: drained(self.engine, UpgradeEvent),
            "the outbox to drain",
            timeout=self.size.drain_timeout,
        )

    def check(self) -> Report:
        """The fault tier's checker over everything the run did."""
        return check(
            self.engine,
            self.handled_dir,
            self.ledger.rolled_back,
            event_model=UpgradeEvent,
            proof_model=UpgradeProof,
        )

    def outbox_files(self) -> dict[str, set[str]]:
        """Release -> the files the processes of that release imported ``outbox`` from."""
        found: dict[str, set[str]] = {}
        for path in self.handled_dir.glob("process-*.txt"):
            for line in path.read_text().splitlines():
                release, outbox_file = line.split(" ", 1)
                found.setdefault(release, set()).add(outbox_file)
        return found

    def close(self) -> None:
        """Stop the producers; kill every process still running; dispose of the engine."""
        self.stop_producers()
        for process in self.processes:
            process.kill()
        self.engine.dispose()
