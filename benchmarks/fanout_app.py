"""The application ``benchmarks.fanout`` runs through the real ``outbox work``: one buffer the
application writes, fanned out to four consumers, each a buffer with a handler of its own.

- ``healthy``: handles every group at once.
- ``paused``: the same, but the benchmark pauses it (``outbox.ops.flow.pause``) before the
  first event is written and resumes it later.
- ``failing``: raises on a fraction of its calls (``BENCH_FANOUT_FAIL_FRACTION``, default a
  half), at random; its retry policy waits a short constant time and has attempts enough that
  no group runs out of them (the chance is ``fraction ** attempts``).
- ``limited``: a ``RateLimit`` of ``BENCH_FANOUT_LIMITED_CALLS`` calls a second, the fleet's
  whole; fewer events a second than the application writes, so that it lags. Capped at
  ``BENCH_FANOUT_LIMITED_CONCURRENCY`` groups in flight (default 1), as docs/timeliness.md
  advises for a handler that must not starve the others.

Every handler is at least once, as every handler is: what it was handed survives a SIGKILL of
its worker because each call appends one line to a file of its consumer and process
(``<BENCH_FANOUT_RECORDS>/<consumer>-<pid>.log``) and fsyncs it before it returns. A line is
``ok <time> <attempt> <seq> <seq> ...`` for a call that returned, ``failed <time> <attempt>
<events>`` for one that raised (its events go on to a later attempt); ``<time>`` is the wall
clock at the call. Events carry ``seq``, their number in the order the benchmark wrote them
(0 up to the number written), by which the records are counted.

Steered by the environment (see :class:`Config`); ``python -m outbox --app
benchmarks.fanout_app:app --database-url URL work ...`` loads it.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, RateLimit, RetryPolicy, Settings, Urgency
from outbox.settings import DEFAULT_RESCUE_INTERVAL_SECONDS, DEFAULT_WORKER_STALE_SECONDS

HEALTHY, PAUSED, FAILING, LIMITED = "healthy", "paused", "failing", "limited"
CONSUMERS = (HEALTHY, PAUSED, FAILING, LIMITED)
# The band of the fan-out and of every consumer: the healthy one's promise is its promise.
URGENCY = Urgency.REALTIME
OK, FAILED = "ok", "failed"


class Base(DeclarativeBase):
    pass


class _FanoutColumns(BufferMixin):
    """The columns of an event, shared by the source buffer and every consumer's."""

    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))


class FanoutEvent(_FanoutColumns, Base):
    """The buffer the application writes."""

    __tablename__ = "bench_fanout_events"


class HealthyCopy(_FanoutColumns, Base):
    __tablename__ = "bench_fanout_healthy"


class PausedCopy(_FanoutColumns, Base):
    __tablename__ = "bench_fanout_paused"


class FailingCopy(_FanoutColumns, Base):
    __tablename__ = "bench_fanout_failing"


class LimitedCopy(_FanoutColumns, Base):
    __tablename__ = "bench_fanout_limited"


MODELS: dict[str, type[_FanoutColumns]] = {
    HEALTHY: HealthyCopy,
    PAUSED: PausedCopy,
    FAILING: FailingCopy,
    LIMITED: LimitedCopy,
}


@dataclass(frozen=True)
class Config:
    """What the application is told through the environment: one ``BENCH_FANOUT_<FIELD>``
    variable per field."""

    records: str = ""
    """The directory the handlers append their records to (none: nothing is recorded)."""
    batch_size: int = 1000
    """The fan-out's groups."""
    consumer_batch_size: int = 1000
    """Every consumer's groups."""
    fail_fraction: float = 0.5
    """Of the failing consumer's calls, those that raise."""
    retry_seconds: float = 0.5
    """The failing consumer's wait between two attempts of a group."""
    max_attempts: int = 60
    """The failing consumer's attempts of a group."""
    limited_calls: float = 0.5
    """The limited consumer's calls a second."""
    limited_concurrency: int = 1
    """The limited consumer's groups in flight at once, fleet-wide (0: no cap). A worker holds
    a group while it waits for the group's turn (up to a third of the lease, at most 10 s):
    without a cap, the limited consumer's backlog holds every worker thread waiting for turns,
    and the others wait for a thread (docs/timeliness.md, "keeping one handler from starving
    the others")."""
    rescue_interval: float = DEFAULT_RESCUE_INTERVAL_SECONDS
    """How often workers look for expired leases (the default's)."""
    worker_stale_after: float = DEFAULT_WORKER_STALE_SECONDS
    """A killed worker's groups are rescued this long after its last heartbeat."""

    def environment(self) -> dict[str, str]:
        """The variables that give a process this configuration."""
        return {_variable(name): str(value) for name, value in asdict(self).items()}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Config:
        """The configuration the variables give (each field's default where one is unset)."""
        given: dict[str, Any] = {}
        for field in fields(cls):
            value = environ.get(_variable(field.name))
            if value is not None:
                given[field.name] = type(getattr(cls(), field.name))(value)
        return cls(**given)


def _variable(name: str) -> str:
    return f"BENCH_FANOUT_{name.upper()}"


class Records:
    """A consumer's records: a file per process, one line per call, each fsynced before the
    call returns."""

    def __init__(self, directory: str, consumer: str) -> None:
        self.directory = directory
        self.consumer = consumer
        self._lock = threading.Lock()
        self._open: tuple[int, int] | None = None  # (pid, fd): a forked worker opens its own

    def append(self, line: str) -> None:
        if not self.directory:
            return
        data = f"{line}\n".encode()
        with self._lock:
            fd = self._fd()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # A SIGKILL leaves the page cache to the kernel; the fsync is for a record that
            # must outlive the machine too, as a downstream's acknowledged write would.
            os.fsync(fd)

    def _fd(self) -> int:
        if self._open is None or self._open[0] != os.getpid():
            path = Path(self.directory) / f"{self.consumer}-{os.getpid()}.log"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._open = (os.getpid(), fd)
        return self._open[1]


def record_files(directory: Path, consumer: str) -> list[Path]:
    """The files the processes' calls of ``consumer`` appended to."""
    return sorted(directory.glob(f"{consumer}-*.log"))


def record_lines(directory: Path, consumer: str) -> Iterator[list[str]]:
    """Every whole line of ``consumer``'s records, split into words (a line a kill cut short,
    without its newline, is no record: its call never returned)."""
    for path in record_files(directory, consumer):
        text = path.read_text(encoding="ascii", errors="replace")
        for line in text.split("\n")[:-1]:
            if line:
                yield line.split(" ")


def _handler(config: Config, consumer: str) -> Any:
    records = Records(config.records, consumer)
    failing = consumer == FAILING
    chance = random.Random()  # seeded by the OS in each process: the workers differ

    def handle(batch: Batch[Any]) -> None:
        called = f"{time.time():.3f} {batch.attempt}"
        if failing and chance.random() < config.fail_fraction:
            records.append(f"{FAILED} {called} {len(batch)}")
            raise RuntimeError("the downstream failed this call")
        rows = batch.rows  # tuples: no model instance per event, the handler stays cheap
        records.append(f"{OK} {called} " + " ".join(str(row.seq) for row in rows))

    handle.__name__ = consumer
    return handle


def build_app(config: Config, url: str | None = None) -> Outbox:
    """The application: the fan-out of :class:`FanoutEvent` to the four consumers, and their
    handlers, on ``url`` (None: ``OUTBOX_DATABASE_URL``, or the command's ``--database-url``)."""
    settings = Settings(
        rescue_interval=config.rescue_interval, worker_stale_after=config.worker_stale_after
    )
    app = Outbox(url, settings=settings)
    app.fanout(FanoutEvent, to=list(MODELS.values()), batch_size=config.batch_size, urgency=URGENCY)
    retry = RetryPolicy(
        max_attempts=config.max_attempts, scale=0.0, base_delay=config.retry_seconds, jitter=0.2
    )
    limit = RateLimit(calls_per_second=config.limited_calls)
    for consumer, model in MODELS.items():
        app.handler(
            model,
            name=consumer,
            batch_size=config.consumer_batch_size,
            urgency=URGENCY,
            retry=retry if consumer == FAILING else None,
            rate_limit=limit if consumer == LIMITED else None,
            concurrency=config.limited_concurrency or None if consumer == LIMITED else None,
        )(_handler(config, consumer))
    return app


app = build_app(Config.from_environment())
