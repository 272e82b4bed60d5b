"""The run-once API where applications already schedule work: a FastAPI lifespan task in two
uvicorn worker processes, and a Flask CLI command run as cron would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import schema
from tests._ports import free_ports
from tests._support import count_rows, wait_for
from tests.acceptance._cli import ROOT
from tests.hosts import fastapi_run_once_host, shop
from tests.hosts._hosts import Host, start

UVICORN_WORKERS = 2
TICK_SECONDS = "1"
HOUR = "3600"


def _runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every result recorded, by every process (a line being written is left for later)."""
    found = []
    for path in sorted(runs_dir.glob("runs-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.endswith("}"):
                found.append(json.loads(line))
    return found


@pytest.fixture
def fastapi_server(tmp_path: Path) -> Iterator[tuple[Host, str, str, Path]]:
    """uvicorn serving the FastAPI application in two worker processes, each running the
    shop's outbox from its lifespan, on one database."""
    url = f"sqlite:///{tmp_path}/shop.sqlite3"
    shop.create(url, signups=30, invoices=0)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    port = free_ports()
    host = start(
        [sys.executable, "-m", "uvicorn", "tests.hosts.fastapi_run_once_host:app",
         "--port", str(port), "--workers", str(UVICORN_WORKERS)],
        tmp_path / "uvicorn.log",
        {shop.DATABASE_URL_ENV: url, fastapi_run_once_host.RUNS_DIR_ENV: str(runs_dir),
         "SHOP_RUN_EVERY": TICK_SECONDS, "SHOP_RUN_PAUSE": "0.1"},
    )  # fmt: skip
    yield host, f"http://127.0.0.1:{port}", url, runs_dir
    host.stop()


def _serving(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_a_fastapi_lifespan_task_in_two_processes_handles_every_event_distributing_once_a_tick(
    fastapi_server: tuple[Host, str, str, Path],
) -> None:
    """Both processes run the outbox while serving: every signup is handled, each handler's
    tick is won by one process only (the other learns it lost), and on SIGTERM each run
    finishes and leaves no worker row behind."""
    host, base, url, runs_dir = fastapi_server
    wait_for(lambda: _serving(base), "uvicorn to serve")
    wait_for(lambda: count_rows(url, shop.Signup.__table__) == 0, "the signups to be handled")
    wait_for(
        lambda: {r["distribution"]["lost"] != [] for r in _runs(runs_dir)} == {True, False},
        "a run to lose a tick to the other process",
    )
    host.stop()

    runs = _runs(runs_dir)
    winners = Counter(
        (name, r["distribution"]["tick"]) for r in runs for name in r["distribution"]["won"]
    )
    succeeded = sum(r["work"]["events_succeeded"] for r in runs)
    assert (0, {1}, 30, 0) == (
        host.popen.returncode,
        set(winners.values()),
        succeeded,
        count_rows(url, schema.workers),
    )


def test_a_flask_command_runs_the_outbox_once_and_a_second_on_the_tick_learns_it_lost(
    tmp_path: Path,
) -> None:
    """``flask outbox-run --every 3600``, twice, as cron would: the first distributes and
    handles the signups (the invoice fails, to be retried later), the second finds the tick
    taken; both exit 0."""
    url = f"sqlite:///{tmp_path}/shop.sqlite3"
    shop.create(url)

    def flask_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flask", "--app", "tests.hosts.flask_run_once_host",
             "outbox-run", "--every", HOUR],
            cwd=ROOT, env={**host_env(), shop.DATABASE_URL_ENV: url},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    first, second = flask_run(), flask_run()
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert (
        (0, ["invoice", "welcome"], 1, 1),
        (0, ["invoice", "welcome"], 0),
    ) == (
        (
            first.returncode,
            sorted(one["distribution"]["won"]),
            one["work"]["groups_succeeded"],
            one["work"]["groups_failed"],
        ),
        (second.returncode, sorted(two["distribution"]["lost"]), two["work"]["groups"]),
    )


def host_env() -> dict[str, str]:
    """The test's environment less any OUTBOX_* setting."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
