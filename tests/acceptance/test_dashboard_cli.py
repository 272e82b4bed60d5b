"""``outbox dashboard``: the console served on its own, as an operator starts it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine

from tests._ports import free_ports
from tests._support import wait_for
from tests.acceptance import many_app
from tests.acceptance._cli import APP, Cli

TOKEN = "dashboard-test-token-0123456789"
MANY = ("--app", "tests.acceptance.many_app:app")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_dashboard_serves_the_api_to_a_token_and_nobody_else(
    cli: Cli, database_url: str
) -> None:
    """With a token in OUTBOX_WEB_TOKENS: /healthz for anyone, the API for the token only;
    SIGTERM stops it (uvicorn ends by the signal it caught, once it has shut down)."""
    port = free_ports()
    running = cli.start(
        "--app", APP, "--database-url", database_url,
        "dashboard", "--port", str(port),
        env={"OUTBOX_WEB_TOKENS": f"ci:viewer:{TOKEN}"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, "the dashboard to answer /healthz")
    without = httpx.get(f"{base}/api/v1/status", timeout=5)
    with_token = httpx.get(
        f"{base}/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    )
    running.send(signal.SIGTERM)
    code = running.wait(20)
    assert (401, 200, ["record_activity", "record_email"], True) == (
        without.status_code,
        with_token.status_code,
        sorted(h["handler"] for h in with_token.json()["handlers"]),
        code in (0, -signal.SIGTERM),
    )


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "Error: the dashboard serves nobody without credentials: set OUTBOX_WEB_TOKENS"),
        (
            ("--host", "192.0.2.1", "--loopback-role", "viewer"),
            "Error: --loopback-role serves without credentials: only with a loopback --host",
        ),
    ],
    ids=["no-credentials", "loopback-role-elsewhere"],
)
def test_the_dashboard_refuses_to_serve_without_credentials(
    cli: Cli, database_url: str, args: tuple[str, ...], message: str
) -> None:
    """No credentials, or a loopback role on an address others reach: exit 2, one line."""
    result = cli.run("--app", APP, "--database-url", database_url, "dashboard", *args)
    assert (2, True) == (result.code, result.stderr.startswith(message)), result.stderr


def test_the_dashboard_of_several_databases_serves_each_and_all_of_them(
    cli: Cli, tmp_path: Path
) -> None:
    """An application serving several databases, without ``--database``: the page of all of
    them and each one's console; with ``--database NAME``, that database's console alone."""
    databases = {name: f"sqlite:///{tmp_path / name}.sqlite3" for name in ("north", "south")}
    env = {many_app.DATABASES_ENV: json.dumps(databases)}
    assert 0 == cli.run(*MANY, "migrate", env=env).code
    for url in databases.values():
        engine = create_engine(url)
        many_app.Base.metadata.create_all(engine)
        engine.dispose()
    answers = []
    for chosen in ((), ("--database", "south")):
        port = free_ports()
        running = cli.start(
            *MANY, *chosen, "dashboard", "--port", str(port), "--loopback-role", "viewer", env=env
        )
        base = f"http://127.0.0.1:{port}"

        def healthy(base: str = base) -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, "the dashboard to answer /healthz")
        answers.append(
            (
                httpx.get(f"{base}/healthz", timeout=5).json(),
                httpx.get(f"{base}/api/v1/databases", timeout=5).status_code,
                httpx.get(f"{base}/databases/north/api/v1/status", timeout=5).status_code,
                httpx.get(f"{base}/api/v1/status", timeout=5).status_code,
            )
        )
        running.send(signal.SIGTERM)
        running.wait(20)
    assert [
        ({"ok": True, "answering": 2, "databases": 2}, 200, 200, 404),
        ({"ok": True}, 404, 404, 200),
    ] == answers
