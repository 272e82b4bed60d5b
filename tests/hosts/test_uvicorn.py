"""outbox inside a uvicorn application: its lines in uvicorn's own format, at their levels."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._ports import free_ports
from tests._support import wait_for
from tests.hosts import asgi_host, shop
from tests.hosts._hosts import Host, start

LOG_CONFIG = Path(__file__).with_name("uvicorn_logging.json")
# uvicorn's `LEVEL:` padded to ten characters, then the message.
LINE = re.compile(r"^(?P<level>[A-Z]+):\s+(?P<message>.*)$")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Host, str]]:
    """uvicorn serving the application with its log configuration, on the shop's database."""
    url = f"sqlite:///{tmp_path}/shop.sqlite3"
    shop.create(url)
    port = free_ports()
    host = start(
        [sys.executable, "-m", "uvicorn", "tests.hosts.asgi_host:app", "--port", str(port),
         "--log-config", str(LOG_CONFIG)],
        tmp_path / "uvicorn.log",
        {shop.DATABASE_URL_ENV: url},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    yield host, base
    host.stop()


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/outbox/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_outbox_lines_in_uvicorns_format_at_their_own_levels(server: tuple[Host, str]) -> None:
    """A batch that succeeded at INFO, one that will be retried at WARNING, the dashboard's
    write at INFO, each as uvicorn writes its own lines; DEBUG filtered out."""
    host, base = server
    wait_for(lambda: _up(base), "uvicorn to serve the dashboard")
    done = httpx.post(f"{base}/run-outbox", timeout=30).json()
    paused = httpx.post(
        f"{base}/outbox/api/v1/handlers/welcome/pause",
        json={"reason": "maintenance"},
        headers={"Authorization": f"Bearer {asgi_host.TOKEN}"},
    )
    host.stop()

    lines = [m for m in map(LINE.match, host.output().splitlines()) if m]
    outbox = {
        (m["level"], m["message"].split(" ")[0])
        for m in lines
        if m["message"].startswith("outbox.")
    }
    assert ({"succeeded": 1, "retried": 1}, 200) == (done, paused.status_code)
    assert {
        ("INFO", "outbox.worker.started"),
        ("INFO", "outbox.batch.handled"),
        ("WARNING", "outbox.batch.handled"),
        ("INFO", "outbox.web.write"),
    } <= outbox
    assert ["WARNING"] == [m["level"] for m in lines if "outcome=retrying" in m["message"]]
    assert set() == {line for line in outbox if line[1] == "outbox.group.claimed"}
