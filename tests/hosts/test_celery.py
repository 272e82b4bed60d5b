"""outbox inside a Celery worker: its lines in Celery's log, at their own levels, with the
logger's name; none of them relabelled WARNING as stray output on stdout would be."""

from __future__ import annotations

import os
import re
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts import celery_host, shop
from tests.hosts._hosts import Host, start

# The Redis the sinks' tests use (tests/sinks/kinds/redis.py), as broker and result backend.
BROKER_URL = os.environ.get("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TASK_TIMEOUT_SECONDS = 30.0
# `[time: LEVEL/process] logger: message`, Celery's line with the logger's name.
LINE = re.compile(r"^\[[^]]+: (?P<level>[A-Z]+)/[^]]+\] (?P<logger>[\w.]+): (?P<message>.*)$")


def _start(tmp_path: Path, env: dict[str, str] | None = None) -> Host:
    """A Celery worker at INFO serving a queue of its own, on the shop's SQLite database."""
    url = f"sqlite:///{tmp_path}/shop.sqlite3"
    shop.create(url)
    queue = f"shop-{uuid.uuid4().hex}"
    return start(
        [sys.executable, "-m", "celery", "-A", "tests.hosts.celery_host", "worker",
         "--loglevel", "INFO", "--pool", "solo", "--queues", queue,
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        tmp_path / "celery.log",
        {shop.DATABASE_URL_ENV: url, celery_host.BROKER_URL_ENV: BROKER_URL,
         celery_host.QUEUE_ENV: queue, **(env or {})},
    )  # fmt: skip


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Host]:
    """A Celery worker at INFO."""
    host = _start(tmp_path)
    yield host
    host.stop()


@pytest.fixture
def debugging_worker(tmp_path: Path) -> Iterator[Host]:
    """A Celery worker at INFO whose application set outbox's logger to DEBUG."""
    host = _start(tmp_path, {celery_host.OUTBOX_LEVEL_ENV: "DEBUG"})
    yield host
    host.stop()


def _lines(worker: Host) -> list[re.Match[str]]:
    """Run the task to its end, stop the worker, and read its log's lines."""
    queue = worker.env[celery_host.QUEUE_ENV]
    celery_host.celery.conf.update(broker_url=BROKER_URL, result_backend=BROKER_URL)
    done = celery_host.run_outbox.apply_async(queue=queue).get(timeout=TASK_TIMEOUT_SECONDS)
    worker.stop(signal.SIGTERM)
    assert {"succeeded": 1, "retried": 1} == done
    return [m for m in map(LINE.match, worker.output().splitlines()) if m]


def test_outbox_lines_in_celerys_log_at_their_own_levels(worker: Host) -> None:
    """INFO stays INFO and WARNING WARNING, under outbox's logger names; DEBUG is filtered
    out by the worker's --loglevel; nothing of outbox's arrives as stdout."""
    lines = _lines(worker)
    outbox = [
        (m["level"], m["logger"], m["message"].split(" ")[0])
        for m in lines
        if "outbox." in m["message"]
    ]
    assert {
        ("INFO", "outbox.worker", "outbox.worker.started"),
        ("INFO", "outbox._engine.batch_job", "outbox.batch.handled"),
        ("WARNING", "outbox._engine.batch_job", "outbox.batch.handled"),
        ("INFO", "outbox.worker", "outbox.worker.stopped"),
    } <= set(outbox)
    assert [] == [line for line in outbox if not line[1].startswith("outbox.")]
    assert [] == [line for line in outbox if line[2] == "outbox.group.claimed"]
    retrying = [m["level"] for m in lines if "outcome=retrying" in m["message"]]
    assert ["WARNING"] == retrying


def test_outbox_debug_when_the_application_asks_for_it(debugging_worker: Host) -> None:
    """`logging.getLogger("outbox").setLevel(logging.DEBUG)` in the application: outbox's
    debug lines appear, labelled DEBUG, while Celery's own stay at the worker's INFO."""
    lines = _lines(debugging_worker)

    debug = {(m["logger"], m["message"].split(" ")[0]) for m in lines if m["level"] == "DEBUG"}
    assert {("outbox._engine.claimer", "outbox.group.claimed")} == debug
