"""A private MariaDB server the fault tests may restart, crash and cut off, as ``_cluster`` is
for PostgreSQL.

``mariadb-install-db`` into a temporary directory, ``mariadbd`` on a free port of 127.0.0.1 with
the grant tables skipped (any client is root: the server is the test's alone). ``innodb_flush_
log_at_trx_commit`` stays 1, so that a commit the client saw acknowledged survives a crash,
which is what the fault suite checks. A crash is SIGKILL; the next start recovers from the redo
log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from tests._ports import free_ports
from tests.faults._cluster import ClusterUnavailableError

SERVER = "/usr/sbin/mariadbd"
INSTALL_DB = "mariadb-install-db"
START_TIMEOUT_SECONDS = 60
ADMIN_USER = "fault_admin"
"""The user the suite's own connections name, so that terminate() spares them."""


def _binaries() -> tuple[str, str]:
    install = shutil.which(INSTALL_DB)
    if install is None or not Path(SERVER).exists():
        raise ClusterUnavailableError(
            f"MariaDB server binaries ({SERVER}, {INSTALL_DB}) not found: install mariadb-server"
        )
    return SERVER, install


class PrivateMariaDB:
    """One MariaDB server of the test's own: start, crash, restart, stop, cut connections."""

    def __init__(self) -> None:
        self.server, self.install = _binaries()
        self.base = Path(tempfile.mkdtemp(prefix="outbox-faults-mariadb-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = free_ports()  # outside the ephemeral range: it is reused on restart
        self._process: subprocess.Popen[bytes] | None = None

    def server_log(self) -> str:
        """What the server wrote to its log so far."""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    # --- life cycle --------------------------------------------------------------------------

    def _options(self) -> list[str]:
        return [
            "--no-defaults",
            f"--datadir={self.data}",
            f"--socket={self.base / 'mariadb.sock'}",
            f"--pid-file={self.base / 'mariadb.pid'}",
            f"--log-error={self.log}",
            *(["--user=root"] if os.geteuid() == 0 else []),
        ]

    def start(self) -> None:
        """Install the data directory (the first time) and start the server; returns once it
        accepts connections."""
        if not self.data.exists():
            done = subprocess.run(
                [self.install, *self._options(), "--auth-root-authentication-method=normal"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=START_TIMEOUT_SECONDS,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{INSTALL_DB} failed: {done.stdout!r} {done.stderr!r}")
        self._process = subprocess.Popen(
            [
                self.server,
                *self._options(),
                "--bind-address=127.0.0.1",
                f"--port={self.port}",
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-flush-log-at-trx-commit=1",
                "--max-connections=200",
                "--character-set-server=utf8mb4",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd did not start:\n{self.server_log()[-3000:]}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        try:
            self._admin("SELECT 1")
        except Exception:  # still starting: recovery, plugins
            return False
        return True

    def crash(self) -> None:
        """Kill the server (SIGKILL), as a crash would; :meth:`start` recovers."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=30)
        self._process = None

    def restart_immediate(self, down_seconds: float = 0.0) -> None:
        """A crash, then a start; ``down_seconds``: how long the server stays down."""
        self.crash()
        if down_seconds:
            time.sleep(down_seconds)
        self.start()

    def stop(self) -> None:
        """Kill the server and delete its files. Idempotent."""
        with contextlib.suppress(Exception):
            self.crash()
        shutil.rmtree(self.base, ignore_errors=True)

    # --- addresses ---------------------------------------------------------------------------

    def url(self, database: str = "", user: str = "root") -> str:
        """A SQLAlchemy URL for a database of this server."""
        return URL.create(
            "mysql+pymysql", username=user, host="127.0.0.1", port=self.port, database=database
        ).render_as_string(hide_password=False)

    def _admin(self, sql: str) -> list[tuple[Any, ...]]:
        engine = create_engine(self.url(user=ADMIN_USER), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                result = conn.execute(text(sql))
                return [tuple(row) for row in result] if result.returns_rows else []
        finally:
            engine.dispose()

    def create_database(self, name: str) -> str:
        """Create an empty database; its URL."""
        self._admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database."""
        self._admin(f"DROP DATABASE IF EXISTS {name}")

    # --- faults ------------------------------------------------------------------------------

    def terminate(self) -> int:
        """KILL every client connection but the suite's own; how many were killed."""
        clients = self._admin(
            "SELECT id FROM information_schema.processlist "
            f"WHERE user <> '{ADMIN_USER}' AND command <> 'Daemon' AND id <> CONNECTION_ID()"
        )
        killed = 0
        for (client,) in clients:
            with contextlib.suppress(Exception):  # gone already
                self._admin(f"KILL CONNECTION {int(client)}")
                killed += 1
        return killed
