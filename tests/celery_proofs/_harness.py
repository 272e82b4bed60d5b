"""Real ``celery worker`` and ``celery beat`` processes on a real broker and database for the
Celery proofs, and what they did, counted.

:class:`Celeries` starts workers (the prefork pool, a chosen concurrency and prefetch
multiplier) and beats for :mod:`tests.celery_proofs.proof_app` on one broker and database,
each with its log in a file, and stops them all at the end, pool children included. The
children of a worker are read from ``/proc``: the proofs SIGKILL them mid-batch.

What the handler did comes from its records (see :mod:`tests.celery_proofs.proof_app`), read
by :func:`read_records`; :func:`tally` counts, per event committed, how many times it was
delivered, which were never delivered (lost) and which were delivered but never committed
(phantom). Which distribution ticks were taken comes from a trigger on ``outbox_handlers``
(:func:`record_ticks`): one row per tick taken, so a tick taken twice shows twice.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kombu import Connection
from sqlalchemy import Engine, func, select, text

from outbox import add_events, db_now, schema
from tests._support import wait_for
from tests.celery_proofs import proof_app
from tests.hosts._hosts import Host, start
from tests.sinks._contract import require_service

T = TypeVar("T")

FULL = os.environ.get("OUTBOX_FULL_RUN") == "1"
"""``OUTBOX_FULL_RUN=1`` (``nox -s full``): the proofs at the issue's sizes."""

BROKER_URLS = {
    "rabbitmq": os.environ.get("OUTBOX_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    # A database of Redis's own, away from the one the sinks' and hosts' tests use.
    "redis": os.environ.get("OUTBOX_TEST_CELERY_REDIS_URL", "redis://127.0.0.1:6379/11"),
}
DEFAULT_PORTS = {"rabbitmq": 5672, "redis": 6379}
APP = "tests.celery_proofs.proof_app:celery"
STOP_SECONDS = 10.0
# `[time: LEVEL/process] logger: message`, the proof app's worker line format.
LINE = re.compile(r"^\[[^]]+: (?P<level>[A-Z]+)/[^]]+\] (?P<logger>[\w.]+): (?P<message>.*)$")
RECEIVED = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]+)\] received")


def broker_url(kind: str) -> str:
    """The URL of the broker ``kind`` (``rabbitmq``, ``redis``); skips, or fails when
    ``CI=true``, when nothing answers there."""
    url = BROKER_URLS[kind]
    where = urlsplit(url)
    require_service(kind, where.hostname or "127.0.0.1", where.port or DEFAULT_PORTS[kind])
    return url


# --- processes ---------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a worker's pool), read from ``/proc``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone while we looked
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(parent) == pid and state != "Z":
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class Celeries:
    """The Celery processes of one proof: one broker, one database, queues of their own."""

    directory: Path
    broker: str
    database_url: str
    settings: dict[str, str] = field(default_factory=dict)
    """The proof app's settings (``PROOF_*``) every process of the proof starts with."""
    queue: str = field(default_factory=lambda: f"proofs-{uuid.uuid4().hex[:12]}")
    outbox_queue: str = field(default_factory=lambda: f"outbox-{uuid.uuid4().hex[:12]}")
    hosts: dict[str, Host] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    """The processes stopped or killed on purpose."""

    @property
    def records(self) -> Path:
        """Where the handler's records go."""
        return self.directory / "records"

    def env(self) -> dict[str, str]:
        """The environment every process of the proof gets."""
        return {
            "OUTBOX_DATABASE_URL": self.database_url,
            proof_app.BROKER_URL_ENV: self.broker,
            proof_app.QUEUE_ENV: self.queue,
            proof_app.OUTBOX_QUEUE_ENV: self.outbox_queue,
            proof_app.RECORD_DIR_ENV: str(self.records),
            proof_app.OUTBOX_LEVEL_ENV: "DEBUG",
            **self.settings,
        }

    def worker(self, name: str, *, concurrency: int, prefetch: int) -> Host:
        """Start ``celery worker`` (prefork) serving the app's queue and outbox's, named after
        the proof's queue: a node name is one RabbitMQ queue (its remote control's), which a
        second run of the proofs at the same time must not share."""
        return self._start(
            name,
            ["worker", "--loglevel", "INFO", "--pool", "prefork",
             "--concurrency", str(concurrency), "--prefetch-multiplier", str(prefetch),
             "--queues", f"{self.queue},{self.outbox_queue}",
             "--hostname", f"{name}-{self.queue}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
        )  # fmt: skip

    def beat(self, name: str) -> Host:
        """Start ``celery beat`` with a schedule file and pid file of its own."""
        return self._start(
            name,
            ["beat", "--loglevel", "INFO", "--max-interval", "1",
             "--schedule", str(self.directory / f"{name}.schedule"),
             "--pidfile", str(self.directory / f"{name}.pid")],
        )  # fmt: skip

    def _start(self, name: str, args: list[str]) -> Host:
        if name in self.hosts:
            self.stop(name)
        self.records.mkdir(exist_ok=True)
        self.ended.discard(name)
        command = [sys.executable, "-m", "celery", "-A", APP, *args]
        log = self.directory / f"{name}-{len(self.hosts)}-{time.monotonic_ns()}.log"
        host = start(command, log, self.env())
        self.hosts[name] = host
        return host

    def pool(self, name: str) -> list[int]:
        """The pool children of worker ``name`` now."""
        return children(self.hosts[name].popen.pid)

    def pools(self) -> set[int]:
        """The pool children of every worker now."""
        return {pid for name in self.hosts for pid in self.pool(name)}

    def stop(self, name: str) -> None:
        """SIGTERM one process, SIGKILL it past ``STOP_SECONDS``, and SIGKILL any child it
        leaves behind. What a proof asserts is read before: a slow warm shutdown only costs
        the run time."""
        host = self.hosts[name]
        self.ended.add(name)
        left = children(host.popen.pid)
        if host.popen.poll() is None:
            host.popen.send_signal(signal.SIGTERM)
            try:
                host.popen.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                host.popen.kill()
                host.popen.wait(STOP_SECONDS)
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill(self, name: str) -> None:
        """SIGKILL one process (a beat, a worker's main process) and wait for its end."""
        host = self.hosts[name]
        self.ended.add(name)
        host.popen.kill()
        host.popen.wait(STOP_SECONDS)

    def stop_all(self) -> None:
        """Stop every process, then delete the proof's queues from the broker."""
        # The beats first: no message is sent to workers that are stopping.
        for name in sorted(self.hosts, key=lambda n: not n.startswith("beat")):
            self.stop(name)
        with Connection(self.broker) as conn:
            channel = conn.default_channel
            for queue in (self.queue, self.outbox_queue):
                with suppress(Exception):
                    channel.queue_delete(queue)

    def check(self) -> None:
        """Fail, with the logs, when a process that should run has exited."""
        dead = [
            n for n, h in self.hosts.items() if n not in self.ended and h.popen.poll() is not None
        ]
        if dead:
            raise AssertionError(f"{', '.join(dead)} exited\n{self.output()}")

    def wait_for(self, condition: Callable[[], T], what: str, timeout: float) -> T:
        """:func:`tests._support.wait_for`, failing at once when a process exits."""

        def checked() -> T:
            self.check()
            return condition()

        return wait_for(checked, what, timeout)

    def log_lines(self) -> list[re.Match[str]]:
        """Every formatted line of every process's log so far."""
        lines = []
        for host in self.hosts.values():
            lines += [m for m in map(LINE.match, host.output().splitlines()) if m]
        for old in self.directory.glob("*.log"):
            if all(old != host.log for host in self.hosts.values()):
                text_ = old.read_text(encoding="utf-8", errors="replace")
                lines += [m for m in map(LINE.match, text_.splitlines()) if m]
        return lines

    def received(self) -> Counter[str]:
        """How many messages each task received, in every worker's log so far."""
        return Counter(
            m["name"] for line in self.log_lines() if (m := RECEIVED.search(line["message"]))
        )

    def output(self) -> str:
        """Every process's log, for a failing assertion's message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.directory.glob("*.log"))
        )


@contextmanager
def celeries(
    directory: Path, broker: str, database_url: str, settings: dict[str, str]
) -> Iterator[Celeries]:
    """:class:`Celeries` for one proof, every process stopped at the end."""
    processes = Celeries(directory, broker, database_url, settings)
    try:
        yield processes
    finally:
        processes.stop_all()


def killed(pid: int) -> float:
    """SIGKILL ``pid``; the wall-clock time of the kill."""
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return at


# --- the handler's records ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the handler: the group, its attempt, the process, and when."""

    group: str
    attempt: int
    pid: int
    at: float

    @property
    def key(self) -> tuple[str, int, int]:
        """The call, whenever it was recorded: its group, attempt and process."""
        return (self.group, self.attempt, self.pid)


@dataclass(frozen=True, slots=True)
class Records:
    """What the handler recorded, in every process."""

    starts: list[Call]
    ends: list[Call]
    deliveries: list[tuple[int, str, int, int]]
    """``(event id, group, attempt, pid)`` for each event delivered."""

    def in_flight(self, pids: Iterable[int]) -> list[Call]:
        """The calls begun and not ended in processes ``pids``."""
        ended = {call.key for call in self.ends}
        alive = set(pids)
        return [c for c in self.starts if c.pid in alive and c.key not in ended]

    def started_after(self, group: str, at: float) -> list[Call]:
        """The calls for ``group`` begun after ``at``."""
        return [c for c in self.starts if c.group == group and c.at > at]

    def delivered(self) -> Counter[int]:
        """How many times each event was delivered."""
        return Counter(event for event, *_ in self.deliveries)

    def group_sizes(self) -> list[int]:
        """The events of each call that delivered, in the order recorded."""
        return list(Counter((g, a, p) for _, g, a, p in self.deliveries).values())


def read_records(directory: Path) -> Records:
    """Everything every process recorded under ``directory`` so far (a line a kill cut
    short is left out)."""
    starts: list[Call] = []
    ends: list[Call] = []
    deliveries: list[tuple[int, str, int, int]] = []
    for path in sorted(directory.glob("record-*.log")):
        data = path.read_text(encoding="utf-8")
        for line in data.splitlines(keepends=True):
            if not line.endswith("\n"):
                continue
            kind, *rest = line.split()
            if kind == "event":
                deliveries.append((int(rest[0]), rest[1], int(rest[2]), int(rest[3])))
            else:
                call = Call(rest[0], int(rest[1]), int(rest[2]), float(rest[3]))
                (starts if kind == "start" else ends).append(call)
    starts.sort(key=lambda c: c.at)
    ends.sort(key=lambda c: c.at)
    return Records(starts, ends, deliveries)


@dataclass(frozen=True, slots=True)
class Tally:
    """Every committed event, counted by what became of it."""

    committed: int
    delivered: int
    """Events delivered at least once."""
    lost: list[int]
    """Committed, never delivered."""
    phantom: list[int]
    """Delivered, never committed."""
    repeated: dict[int, int]
    """Events delivered more than once, and how many times."""


def tally(committed: Iterable[int], records: Records) -> Tally:
    """Count each committed event's deliveries."""
    wanted = set(committed)
    times = records.delivered()
    return Tally(
        committed=len(wanted),
        delivered=len(wanted & set(times)),
        lost=sorted(wanted - set(times)),
        phantom=sorted(set(times) - wanted),
        repeated={event: n for event, n in times.items() if n > 1},
    )


# --- the database ------------------------------------------------------------------------


def reset(url: str) -> None:
    """The proof app's buffer, empty, beside outbox's tables (made by the suite's fixture),
    and a fresh record of the distribution ticks taken."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        proof_app.Base.metadata.drop_all(conn)
        proof_app.Base.metadata.create_all(conn)
    record_ticks(engine)
    engine.dispose()


_TICKS = "celery_proof_ticks"
_RECORD_TICKS = {
    "postgresql": [
        f"DROP TABLE IF EXISTS {_TICKS}",
        f"CREATE TABLE {_TICKS} (id BIGSERIAL PRIMARY KEY, handler VARCHAR(200) NOT NULL, "
        "tick BIGINT NOT NULL, taken_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
        "CREATE OR REPLACE FUNCTION celery_proof_tick() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF NEW.distributed_tick IS NOT NULL AND (TG_OP = 'INSERT' OR "
        "NEW.distributed_tick IS DISTINCT FROM OLD.distributed_tick) THEN "
        f"INSERT INTO {_TICKS} (handler, tick) VALUES (NEW.name, NEW.distributed_tick); "
        "END IF; RETURN NULL; END $$",
        "DROP TRIGGER IF EXISTS celery_proof_tick ON outbox_handlers",
        "CREATE TRIGGER celery_proof_tick AFTER INSERT OR UPDATE ON outbox_handlers "
        "FOR EACH ROW EXECUTE FUNCTION celery_proof_tick()",
    ],
    "mysql": [
        f"DROP TABLE IF EXISTS {_TICKS}",
        f"CREATE TABLE {_TICKS} (id BIGINT AUTO_INCREMENT PRIMARY KEY, "
        "handler VARCHAR(200) NOT NULL, tick BIGINT NOT NULL, "
        "taken_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
        "DROP TRIGGER IF EXISTS celery_proof_tick_insert",
        "CREATE TRIGGER celery_proof_tick_insert AFTER INSERT ON outbox_handlers FOR EACH ROW "
        f"INSERT INTO {_TICKS} (handler, tick) SELECT NEW.name, NEW.distributed_tick FROM DUAL "
        "WHERE NEW.distributed_tick IS NOT NULL",
        "DROP TRIGGER IF EXISTS celery_proof_tick_update",
        "CREATE TRIGGER celery_proof_tick_update AFTER UPDATE ON outbox_handlers FOR EACH ROW "
        f"INSERT INTO {_TICKS} (handler, tick) SELECT NEW.name, NEW.distributed_tick FROM DUAL "
        "WHERE NEW.distributed_tick IS NOT NULL AND NOT (NEW.distributed_tick <=> "
        "OLD.distributed_tick)",
    ],
}


def record_ticks(engine: Engine) -> None:
    """A trigger on ``outbox_handlers`` that records every distribution tick taken, once per
    taking: a tick taken twice is recorded twice."""
    with engine.begin() as conn:
        for statement in _RECORD_TICKS[engine.dialect.name]:
            conn.execute(text(statement))


def ticks(engine: Engine) -> list[int]:
    """The ticks taken for the proof app's handler, in the order taken (milliseconds since
    the epoch of each tick's start)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT tick FROM {_TICKS} WHERE handler = :name ORDER BY id"),
            {"name": proof_app.HANDLER},
        )
        return [int(tick) for tick in rows.scalars()]


def database_tick(engine: Engine, every_ms: int) -> int:
    """The tick of ``every_ms`` milliseconds the database's clock is in now, named as
    distribution names it: milliseconds since the epoch of its start."""
    with engine.connect() as conn:
        now = conn.execute(select(db_now())).scalar_one()
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)  # outbox's times without a zone are UTC
    return int(now.timestamp() * 1000) // every_ms * every_ms


def commit(engine: Engine, count: int, label: str) -> list[int]:
    """Commit ``count`` events in one transaction; their ids."""
    model: Any = proof_app.ProofEvent
    with engine.begin() as conn:
        before = conn.execute(select(func.coalesce(func.max(model.id), 0))).scalar_one()
        add_events(conn, model, [{"label": label} for _ in range(count)])
        ids = conn.execute(select(model.id).where(model.id > before).order_by(model.id))
        return list(ids.scalars())


def drained(engine: Engine) -> bool:
    """True when the buffer and the job table are both empty."""
    model: Any = proof_app.ProofEvent
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(model.__table__)).scalar_one()
        jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    return rows == 0 and jobs == 0


def archived(engine: Engine, status: str) -> list[Any]:
    """The archive's rows of the proof app's handler with ``status``."""
    archive = schema.archive
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(archive.c.event_id, archive.c.group_id, archive.c.error).where(
                    archive.c.handler == proof_app.HANDLER, archive.c.status == status
                )
            )
        )


def attempts_of(engine: Engine, group: str) -> list[Any]:
    """The ended attempts recorded for ``group``, in order."""
    table = schema.attempts
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(table.c.attempt, table.c.outcome, table.c.error)
                .where(table.c.group_id == uuid.UUID(group))
                .order_by(table.c.id)
            )
        )
