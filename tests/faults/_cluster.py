"""A private PostgreSQL cluster the fault tests may restart, crash and cut off at will.

The session's shared PostgreSQL must never be restarted under other tests, so the fault suite
runs its own: ``initdb`` into a temporary directory, ``pg_ctl start`` on a free port, trust
authentication on 127.0.0.1 only. PostgreSQL refuses to run as root, so when the tests run as
root the server runs as the ``postgres`` OS user (``runuser -u postgres --``) in a directory
that user owns.

``synchronous_commit`` and ``fsync`` stay on: a commit the client saw acknowledged must survive
an immediate (crash) restart, which is exactly what the fault suite checks.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from tests._ports import free_ports

BINDIR_ENV = "OUTBOX_TEST_PG_BINDIR"
DEFAULT_BINDIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin")
SERVER_USER = "postgres"
ADMIN_APPLICATION = "fault-admin"
MAX_CONNECTIONS = 200
PG_CTL_TIMEOUT_SECONDS = 60


class ClusterUnavailableError(RuntimeError):
    """The PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed."""


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres; raises when there is none."""
    candidates = [os.environ.get(BINDIR_ENV, ""), *DEFAULT_BINDIRS]
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(str(Path(which).parent))
    for candidate in candidates:
        if candidate and all((Path(candidate) / b).exists() for b in ("initdb", "pg_ctl")):
            return Path(candidate)
    raise ClusterUnavailableError(
        f"PostgreSQL server binaries (initdb, pg_ctl) not found in {candidates}; "
        f"install them or set {BINDIR_ENV}"
    )


class PrivateCluster:
    """One PostgreSQL server of the test's own: start, restart (fast or immediate), stop."""

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.base = Path(tempfile.mkdtemp(prefix="outbox-faults-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = free_ports()  # outside the ephemeral range: it is reused on restart
        self._as_root = os.geteuid() == 0
        if self._as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, user.pw_uid, user.pw_gid)

    # --- running the server binaries --------------------------------------------------------

    def _run(self, binary: str, *args: str, timeout: float = PG_CTL_TIMEOUT_SECONDS) -> str:
        command = [str(self.bindir / binary), *args]
        if self._as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
            cwd=self.base,
        )
        output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
        if done.returncode != 0:
            raise RuntimeError(
                f"{binary} {' '.join(args)} failed ({done.returncode}): {output}\n"
                f"server log:\n{self.server_log()[-3000:]}"
            )
        return output

    def _pg_ctl(self, *args: str) -> str:
        return self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", str(PG_CTL_TIMEOUT_SECONDS), *args,
        )  # fmt: skip

    def server_log(self) -> str:
        """What the server wrote to its log so far."""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """initdb (the first time) and start the server; returns once it accepts connections."""
        if not self.data.exists():
            self._run(
                "initdb", "-D", str(self.data), "-U", SERVER_USER, "--auth=trust",
                "--no-sync", "--encoding=UTF8", "--locale=C",
            )  # fmt: skip
            settings = {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self.base}'",
                "max_connections": str(MAX_CONNECTIONS),
                "synchronous_commit": "on",
                "fsync": "on",
                "shared_buffers": "64MB",
                "log_min_messages": "warning",
                "log_connections": "off",
            }
            with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
                conf.write("\n# outbox fault suite\n")
                conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._pg_ctl("start")

    def restart_fast(self) -> None:
        """A clean restart: clients are disconnected, open transactions rolled back."""
        self._pg_ctl("restart", "-m", "fast")

    def restart_immediate(self, down_seconds: float = 0.0) -> None:
        """A crash restart: every process killed at once, recovery from the WAL on start.

        ``down_seconds``: how long the server stays down before it starts again.
        """
        self.crash()
        if down_seconds:
            time.sleep(down_seconds)
        self._pg_ctl("start")

    def crash(self) -> None:
        """Stop the server the way a crash would (``-m immediate``); :meth:`start` recovers."""
        self._pg_ctl("stop", "-m", "immediate")

    def stop(self) -> None:
        """Stop the server (at once) and delete its files. Idempotent."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    # --- addresses ---------------------------------------------------------------------------

    def url(self, database: str = "postgres", application_name: str | None = None) -> str:
        """A SQLAlchemy URL for a database of this cluster, optionally naming the client."""
        query = {"application_name": application_name} if application_name else {}
        return URL.create(
            "postgresql+psycopg",
            username=SERVER_USER,
            host="127.0.0.1",
            port=self.port,
            database=database,
            query=query,
        ).render_as_string(hide_password=False)

    def _admin(self, sql: str, **params: object) -> list[tuple[Any, ...]]:
        engine = create_engine(
            self.url(application_name=ADMIN_APPLICATION),
            isolation_level="AUTOCOMMIT",
            poolclass=NullPool,
        )
        try:
            with engine.connect() as conn:
                result = conn.execute(text(sql), params)
                return [tuple(row) for row in result] if result.returns_rows else []
        finally:
            engine.dispose()

    def create_database(self, name: str) -> str:
        """Create an empty database; its URL."""
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting its clients."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # --- faults ------------------------------------------------------------------------------

    def terminate(self, application_name: str | None = None) -> int:
        """pg_terminate_backend the clients named ``application_name`` (None: every client
        except the suite's own admin connections); how many were terminated."""
        condition = "application_name = :name" if application_name else "application_name <> :name"
        rows = self._admin(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND {condition}",
            name=application_name or ADMIN_APPLICATION,
        )
        return int(rows[0][0])
