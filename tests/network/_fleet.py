"""A fleet of ``outbox work`` processes on hosts of their own (``_netns``), each reaching the
private database server through a proxy on its router's far side; and what their handlers
delivered, with when each call began.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url

from outbox import db_now, schema
from tests._proxy import Proxy
from tests.faults._processes import OutboxProcess
from tests.faults.fault_app import BATCH_SIZE_ENV, HANDLER_SECONDS_ENV, NETWORK_TIMEOUT_ENV
from tests.network._netns import Host

T = TypeVar("T")

LEASE_SECONDS = 4.0
NETWORK_TIMEOUT_SECONDS = 3.0
HANDLER_SECONDS = 0.4
BATCH_SIZE = 10
# A link of 96 kbit/s whose queue holds 100 ms of packets: what waits there is late by up to
# that much on each crossing, and what overflows it is lost (and sent again by TCP, a fifth of
# a second or more later). A heartbeat, a transaction of several statements, comes a second
# or so later than its interval, well within the stale age.
SLOW_LINK = ["tbf", "rate", "96kbit", "burst", "1600", "latency", "100ms"]
WORKER = [
    "work",
    "--concurrency", "2",
    "--lease", str(LEASE_SECONDS),
    "--poll-interval", "0.2",
    "--distribute-every", "0.5",
    "--shutdown-grace-period", "10",
]  # fmt: skip


@dataclass
class HostWorker:
    """One host, its proxy to the database, and the worker running in it."""

    host: Host
    proxy: Proxy
    worker: OutboxProcess

    @property
    def pid(self) -> int:
        return self.worker.pid


@contextmanager
def fleet(
    url: str,
    names: Sequence[str],
    handled_dir: Path,
    log_dir: Path,
    *,
    clock_offsets: dict[str, float] | None = None,
    skewed_clock: Path | None = None,
) -> Iterator[dict[str, HostWorker]]:
    """A host with one worker for each of ``names``; ``clock_offsets``: seconds the wall clock
    of a host's worker is off, by the library ``skewed_clock`` (:func:`build_skewed_clock`)."""
    parsed = make_url(url)
    assert parsed.host is not None
    assert parsed.port is not None
    with ExitStack() as stack:
        hosts: dict[str, HostWorker] = {}
        for name in names:
            host = stack.enter_context(Host())
            proxy = stack.enter_context(Proxy(parsed.host, parsed.port, listen_host=host.address))
            across = parsed.set(host=host.address, port=proxy.port).render_as_string(False)
            env = {
                BATCH_SIZE_ENV: str(BATCH_SIZE),
                HANDLER_SECONDS_ENV: str(HANDLER_SECONDS),
                NETWORK_TIMEOUT_ENV: str(NETWORK_TIMEOUT_SECONDS),
            }
            offset = (clock_offsets or {}).get(name)
            if offset is not None:
                assert skewed_clock is not None
                env.update(LD_PRELOAD=str(skewed_clock), SKEWED_CLOCK_SECONDS=str(offset))
            worker = OutboxProcess(
                name,
                across,
                WORKER,
                handled_dir=handled_dir,
                log_dir=log_dir,
                env=env,
                program=("ip", "netns", "exec", host.name, sys.executable, "-m", "outbox"),
            )
            stack.callback(worker.kill)
            hosts[name] = HostWorker(host, proxy, worker)
        yield hosts


class Call(NamedTuple):
    """One event handed to a handler: by which process, when the call began."""

    key: int
    group: str
    pid: int
    called_at: float


def calls(handled_dir: Path) -> list[Call]:
    """Every event every handler was handed, from the delivery files (torn lines left out)."""
    found: list[Call] = []
    for path in sorted(handled_dir.glob("handled-*.log")):
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            key, group, _attempt, pid, called_at = line.split(" ")
            found.append(Call(int(key), group, int(pid), float(called_at)))
    return found


def held_by(engine: Engine, pid: int) -> set[int]:
    """The ids of the batch jobs leased to the worker of process ``pid``."""
    jobs = schema.jobs
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id).where(
                jobs.c.kind == schema.JobKind.BATCH,
                jobs.c.lease_owner.like(f"%:{pid}:%"),
            )
        )
        return set(rows.scalars())


def heard_since(engine: Engine, pid: int, moment: object) -> bool:
    """Whether the worker of process ``pid`` has heartbeaten since the database's ``moment``."""
    workers = schema.workers
    with engine.connect() as conn:
        found = conn.execute(
            select(workers.c.id).where(workers.c.pid == pid, workers.c.heartbeat_at > moment)
        ).first()
    return found is not None


def database_now(engine: Engine) -> object:
    """The database's clock, now."""
    with engine.connect() as conn:
        return conn.execute(select(db_now())).scalar_one()


def seconds_until(condition: Callable[[], T], what: str, timeout: float) -> float:
    """How long until ``condition`` holds, polled every 0.1 s; fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def build_skewed_clock(directory: Path) -> Path:
    """Build the library that puts a process's wall clock wrong (``skewed_clock.c``) into
    ``directory``; skips (fails when ``CI=true``) without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        reason = "no C compiler to build tests/network/skewed_clock.c (apt-get install gcc)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: network tests must not skip)", pytrace=False)
        pytest.skip(reason)
    built = directory / "skewed_clock.so"
    source = Path(__file__).with_name("skewed_clock.c")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"], check=True
    )
    return built


def heartbeat_offsets(engine: Engine, pids: Sequence[int]) -> list[float]:
    """Seconds between each worker's last heartbeat, as stored, and the database's clock now."""
    workers = schema.workers
    offsets = []
    with engine.connect() as conn:
        for pid in pids:
            stamped, now = conn.execute(
                select(workers.c.heartbeat_at, db_now()).where(workers.c.pid == pid)
            ).one()
            offsets.append((_utc(stamped) - _utc(now)).total_seconds())
    return offsets


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def latenesses(stderr: str) -> list[float]:
    """The ``lateness`` of every batch a worker's JSON log reports."""
    found = []
    for line in stderr.splitlines():
        if '"lateness"' in line:
            found.append(float(json.loads(line)["lateness"]))
    return found


def heartbeat_gaps(engine: Engine, pid: int, seconds: float) -> list[float]:
    """The gaps, in the database's time, between the heartbeats of the worker of process
    ``pid`` over the next ``seconds``, read every 0.1 s."""
    workers = schema.workers
    seen: list[dt.datetime] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            stamped = conn.execute(
                select(workers.c.heartbeat_at).where(workers.c.pid == pid)
            ).scalar_one_or_none()
        if stamped is not None and (not seen or _utc(stamped) != seen[-1]):
            seen.append(_utc(stamped))
        time.sleep(0.1)
    return [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(seen)]
