"""outbox inside a Flask application: its lines in the format Flask's documentation sets up,
at their levels, naming outbox's own module."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._ports import free_ports
from tests._support import wait_for
from tests.hosts import shop
from tests.hosts._hosts import Host, start

# `[time] LEVEL in module: message`
LINE = re.compile(r"^\[[^]]+\] (?P<level>[A-Z]+) in (?P<module>\w+): (?P<message>.*)$")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Host, str]]:
    """``flask run`` serving the application, on the shop's database."""
    url = f"sqlite:///{tmp_path}/shop.sqlite3"
    shop.create(url)
    port = free_ports()
    host = start(
        [sys.executable, "-m", "flask", "--app", "tests.hosts.flask_host", "run",
         "--port", str(port)],
        tmp_path / "flask.log",
        {shop.DATABASE_URL_ENV: url},
    )  # fmt: skip
    yield host, f"http://127.0.0.1:{port}"
    host.stop()


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/").status_code == 404
    except httpx.TransportError:
        return False


def test_outbox_lines_in_flasks_format_at_their_own_levels(server: tuple[Host, str]) -> None:
    """INFO and WARNING as Flask's lines show them, each naming the outbox module that spoke
    (the line's caller, not the logging machinery); DEBUG filtered out."""
    host, base = server
    wait_for(lambda: _up(base), "flask to serve")
    done = httpx.post(f"{base}/run-outbox", timeout=30).json()
    host.stop()

    lines = [m for m in map(LINE.match, host.output().splitlines()) if m]
    outbox = {
        (m["level"], m["module"], m["message"].split(" ")[0])
        for m in lines
        if m["message"].startswith("outbox.")
    }
    assert {"succeeded": 1, "retried": 1} == done
    assert {
        ("INFO", "worker", "outbox.worker.started"),
        ("INFO", "batch_job", "outbox.batch.handled"),
        ("WARNING", "batch_job", "outbox.batch.handled"),
        ("INFO", "worker", "outbox.worker.stopped"),
    } <= outbox
    assert ["WARNING"] == [m["level"] for m in lines if "outcome=retrying" in m["message"]]
    assert set() == {line for line in outbox if line[2] == "outbox.group.claimed"}
