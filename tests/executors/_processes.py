"""Real ``celery worker`` and ``celery beat`` processes running :mod:`tests.executors.celery_app`,
each on a queue of its own, and what a test reads of them."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from celery import Celery as CeleryClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session

from outbox import Outbox, schema
from outbox._engine import distributor
from outbox.executors.celery import RUN_JOB_TASK
from tests.executors import celery_app
from tests.hosts._hosts import Host, start

REDIS_URL = os.environ.get("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get("OUTBOX_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
BROKERS = {"redis": REDIS_URL, "rabbitmq": RABBITMQ_URL}


@dataclass
class Celery:
    """A worker (and a beat, once started) of one test: its database, broker and queue."""

    tmp_path: Path
    database_url: str
    broker_url: str
    queue: str
    calls: Path
    hosts: list[Host]

    def env(self, **extra: str) -> dict[str, str]:
        return {
            celery_app.DATABASE_URL_ENV: self.database_url,
            celery_app.BROKER_URL_ENV: self.broker_url,
            celery_app.QUEUE_ENV: self.queue,
            celery_app.CALLS_ENV: str(self.calls),
            **extra,
        }

    def worker(self, *, concurrency: int = 2, name: str = "w1", **extra: str) -> Host:
        """A prefork worker consuming the test's queue, its log at DEBUG."""
        host = start(
            [sys.executable, "-m", "celery", "-A", "tests.executors.celery_app", "worker",
             "--loglevel", "DEBUG", "--pool", "prefork", "--concurrency", str(concurrency),
             "--queues", self.queue, "--hostname", f"{name}-{self.queue}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            self.tmp_path / f"worker-{name}.log",
            self.env(**extra),
        )  # fmt: skip
        self.hosts.append(host)
        return host

    def beat(self) -> Host:
        """A beat process sending outbox's two periodic tasks."""
        host = start(
            [sys.executable, "-m", "celery", "-A", "tests.executors.celery_app", "beat",
             "--loglevel", "INFO", "--schedule", str(self.tmp_path / "beat-schedule"),
             ],
            self.tmp_path / "beat.log",
            self.env(),
        )  # fmt: skip
        self.hosts.append(host)
        return host

    def stop(self) -> None:
        for host in reversed(self.hosts):
            host.stop()

    def call_sizes(self) -> list[int]:
        """The size of each group handed to the handler, in the order called."""
        if not self.calls.exists():
            return []
        return [int(line.split()[0]) for line in self.calls.read_text().splitlines()]

    def output(self) -> str:
        return "\n".join(host.output() for host in self.hosts)


def new(tmp_path: Path, database_url: str, broker_url: str) -> Celery:
    """A test's processes, none started yet, on a fresh queue."""
    queue = f"outbox-test-{uuid.uuid4().hex[:12]}"
    return Celery(tmp_path, database_url, broker_url, queue, tmp_path / "calls.txt", [])


def prepare(database_url: str, events: int) -> None:
    """The test application's buffer on ``database_url`` (outbox's tables already there), with
    ``events`` events waiting."""
    engine = create_engine(database_url)
    try:
        celery_app.Base.metadata.drop_all(engine)
        celery_app.Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add_all(celery_app.Delivery(n=n) for n in range(events))
    finally:
        engine.dispose()


def prepare_capped(database_url: str, events: int) -> None:
    """``events`` events waiting for the handler capped at one group at a time."""
    engine = create_engine(database_url)
    try:
        with Session(engine) as session, session.begin():
            session.add_all(celery_app.CappedDelivery(n=n) for n in range(events))
    finally:
        engine.dispose()


def waiting_capped(database_url: str) -> int:
    """Events of the capped handler still in its buffer."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            count = select(func.count()).select_from(celery_app.CappedDelivery)
            return int(conn.execute(count).scalar_one())
    finally:
        engine.dispose()


def archived(database_url: str) -> list[int]:
    """The ids of the events archived as succeeded."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(schema.archive.c.event_id).where(
                    schema.archive.c.status == schema.ArchiveStatus.SUCCEEDED,
                    schema.archive.c.handler == "deliver",
                )
            )
            return sorted(int(event_id) for (event_id,) in rows)
    finally:
        engine.dispose()


def waiting(database_url: str) -> int:
    """Events still in the buffer."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(celery_app.Delivery)).scalar())
    finally:
        engine.dispose()


def jobs(database_url: str) -> list[dict[str, object]]:
    """Every row of ``outbox_jobs``."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(select(schema.jobs))]
    finally:
        engine.dispose()


def app(url: str) -> Outbox:
    """The test application's outbox, in the test's process (its handler is not run here)."""
    outbox = Outbox(url, settings=celery_app.SETTINGS)
    outbox.handler(
        celery_app.Delivery, batch_size=celery_app.BATCH_SIZE, archive=True, name="deliver"
    )(lambda batch: None)
    return outbox


def claim_job(url: str) -> int:
    """Distribute for the waiting events, in the test's process; the claim job's id."""
    outbox = app(url)
    try:
        distributor.run_once(outbox)
    finally:
        outbox.engine.dispose()
    (job,) = jobs(url)
    return int(job["id"])  # type: ignore[call-overload]


def send(processes: Celery, job_id: int, times: int = 1) -> None:
    """Publish the message that runs ``job_id``, ``times`` times, as a duplicate publish would."""
    client = CeleryClient("client", broker=processes.broker_url)
    try:
        for _ in range(times):
            client.send_task(RUN_JOB_TASK, args=(job_id,), queue=processes.queue)
    finally:
        client.close()
