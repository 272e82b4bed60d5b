"""``outbox work --metrics-port``: a worker serves Prometheus metrics while it runs."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from tests._ports import free_ports
from tests._support import wait_for
from tests.acceptance._cli import APP, Cli

HANDLED = 'outbox_events_total{band="HOUR",handler="record_activity",outcome="succeeded"} 25.0'


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None


def test_worker_serves_metrics_of_its_handlers(
    cli: Cli, postgres_database: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """A scrape shows the handled events counter and the backlog gauge of each handler."""
    commit_events(connect(postgres_database), 25)
    port = free_ports()
    worker = cli.start(
        "--app", APP, "--database-url", postgres_database,
        "work", "--metrics-port", str(port), "--distribute-every", "0.2", "--poll-interval", "0.2",
    )  # fmt: skip
    try:
        text = wait_for(
            lambda: (t := _scrape(port)) and HANDLED in t and t,
            "25 handled events in the scraped metrics",
        )
    finally:
        worker.send(signal.SIGTERM)
        worker.wait(timeout=20)
    assert True is ('outbox_unclaimed_events{band="HOUR",handler="record_activity"} 0.0' in text)


def test_each_forked_worker_serves_metrics_on_its_own_port(
    cli: Cli, postgres_database: str
) -> None:
    """``--processes 2 --metrics-port P``: worker 0 answers on P, worker 1 on P + 1."""
    port = free_ports(2)
    worker = cli.start(
        "--app", APP, "--database-url", postgres_database,
        "work", "--processes", "2", "--metrics-port", str(port), "--poll-interval", "0.2",
    )  # fmt: skip
    try:
        texts = wait_for(
            lambda: all(texts := [_scrape(port), _scrape(port + 1)]) and texts,
            "both workers' metrics endpoints",
        )
    finally:
        worker.send(signal.SIGTERM)
        code = worker.wait(timeout=20)
    assert (0, [True, True]) == (code, ["outbox_unclaimed_events" in str(t) for t in texts])
