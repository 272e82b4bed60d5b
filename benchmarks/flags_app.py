"""The application of the flags proof (``benchmarks/flags.py``): the ``employee`` table of
"Using your database as a queue", whose rows the application flags with ``needs_work_done`` and
versions with every change, and a flag handler of those rows that records what it was handed.

``outbox --app benchmarks.flags_app:app work`` runs it. It is steered by one environment
variable, ``BENCH_FLAGS`` (JSON, read when the module is imported; the keys of
:class:`HandlerConfig`): the batch size, how long a call to the downstream takes, the share of
calls that fail, the retry policy's wait and attempts, and the workers' settings.

Each call of the handler records itself before it returns or raises, in a transaction of its
own committed first, so that a SIGKILL cannot leave a success unrecorded: one row in
``bench_flags_calls`` (process, group, attempt, start and end as ``time.time()``, succeeded or
not) and one row per employee handed in ``bench_flags_handed`` (id, version, name). A flag is
cleared only after its handler returned, so every clear has its recorded success.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from dataclasses import asdict, dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    String,
    Table,
    insert,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, FlaggedRowsMixin, Outbox, RetryPolicy, Settings

CONFIG_ENV = "BENCH_FLAGS"
HANDLER = "sync_employees"


@dataclass(frozen=True)
class HandlerConfig:
    """What the handler and its workers do; durations in float seconds.

    ``call_seconds``: how long a call to the downstream takes (a sleep). ``fail_fraction``: the
    share of calls that fail (at random, after the call): the whole group is retried.
    ``retry_seconds``: the retry policy's wait after a failed attempt, ``±retry_jitter`` of it,
    chosen longer than ``poll_interval``, an idle worker's wait before it looks for work again.
    """

    batch_size: int = 100
    call_seconds: float = 0.2
    fail_fraction: float = 0.2
    retry_seconds: float = 2.0
    retry_jitter: float = 0.1
    max_attempts: int = 15
    poll_interval: float = 0.5
    lease_seconds: float = 10.0
    worker_stale_after: float = 3.0
    rescue_interval: float = 1.0
    seed: int = 0

    def retry(self) -> RetryPolicy:
        """The same wait after every failed attempt: ``retry_seconds`` ``±retry_jitter``."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            scale=0.0,
            base_delay=self.retry_seconds,
            jitter=self.retry_jitter,
        )

    def shortest_retry_wait(self) -> float:
        """The least a failed group waits before its next attempt: the jitter's low end."""
        return self.retry_seconds * (1 - self.retry_jitter)

    def settings(self) -> Settings:
        """The workers' settings: short enough that a killed worker's groups come back within
        seconds (its heartbeat stops; its jobs are rescued once it is stale)."""
        return Settings(
            poll_interval=self.poll_interval,
            lease_seconds=self.lease_seconds,
            worker_stale_after=self.worker_stale_after,
            rescue_interval=self.rescue_interval,
        )

    def environment(self) -> dict[str, str]:
        """The environment that hands this configuration to ``outbox work``."""
        return {CONFIG_ENV: json.dumps(asdict(self))}


class Base(DeclarativeBase):
    pass


class Employee(Base):
    """The article's table: the application sets ``needs_work_done`` and moves ``version`` with
    every change of a row, in the same UPDATE."""

    __tablename__ = "employee"
    __table_args__ = (
        # How the distribution finds flagged rows: partial where the database has it.
        Index(
            "ix_employee_flagged",
            "needs_work_done",
            "id",
            postgresql_where=text("needs_work_done"),
            sqlite_where=text("needs_work_done"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(100))
    needs_work_done: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)


class EmployeeWork(FlaggedRowsMixin, Base):
    """The flag handler's buffer: outbox writes it, the application never."""

    __tablename__ = "employee_work"


calls = Table(
    "bench_flags_calls",
    Base.metadata,
    Column("id", String(32), primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("group_id", String(36), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("rows", Integer, nullable=False),
    Column("started_at", Double, nullable=False, comment="time.time() as the call began"),
    Column("ended_at", Double, nullable=False, comment="time.time() as it returned or raised"),
    Column("succeeded", Boolean, nullable=False),
)

handed = Table(
    "bench_flags_handed",
    Base.metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("call_id", String(32), nullable=False, index=True),
    Column("employee_id", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("name", String(100), nullable=False),
    # The checks look a cleared state up by employee and version.
    Index("ix_bench_flags_handed_state", "employee_id", "version"),
)


CONFIG = HandlerConfig(**json.loads(os.environ.get(CONFIG_ENV, "{}")))
app = Outbox(settings=CONFIG.settings())
_chance = random.Random(f"{CONFIG.seed}:{os.getpid()}")


class DownstreamError(Exception):
    """The HR system did not take the call."""


@app.flagged(
    Employee,
    flag="needs_work_done",
    version="version",
    buffer=EmployeeWork,
    batch_size=CONFIG.batch_size,
    retry=CONFIG.retry(),
)
def sync_employees(batch: Batch[Employee]) -> None:
    """Send the employees to the HR system (a sleep), which refuses ``fail_fraction`` of the
    calls; record the call and what it was handed, committed before returning or raising."""
    started = time.time()
    time.sleep(CONFIG.call_seconds)
    failed = _chance.random() < CONFIG.fail_fraction
    _record(batch, started, not failed)
    if failed:
        raise DownstreamError("the HR system refused the call")


def _record(batch: Batch[Employee], started: float, succeeded: bool) -> None:
    call = uuid.uuid4().hex
    employees = batch.events
    with app.engine.begin() as conn:
        conn.execute(
            insert(calls),
            {
                "id": call,
                "pid": os.getpid(),
                "group_id": str(batch.group_id),
                "attempt": batch.attempt,
                "rows": len(employees),
                "started_at": started,
                "ended_at": time.time(),
                "succeeded": succeeded,
            },
        )
        conn.execute(
            insert(handed),
            [
                {"call_id": call, "employee_id": e.id, "version": e.version, "name": e.name}
                for e in employees
            ],
        )
