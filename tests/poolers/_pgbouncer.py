"""A PgBouncer of the tests' own, in front of the local PostgreSQL, on a free port.

Transaction pooling, the mode production deployments use and the one that breaks session
state; each instance serves the one database it is started for, logging in to PostgreSQL as
the URL's user (``auth_type = any``: the tests' PostgreSQL trusts local connections).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests._ports import free_ports

# Debian installs it outside an ordinary user's PATH.
_PLACES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
START_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 10.0
POLL_SECONDS = 0.05
# Fewer server sessions than the clients of a worker and its rescuer: transactions of
# different clients share sessions, which is what breaks session state.
POOL_SIZE = 5


def executable() -> str | None:
    """Where the ``pgbouncer`` program is, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((place for place in _PLACES if os.access(place, os.X_OK)), None)


class PgBouncer:
    """One ``pgbouncer`` process; :attr:`url` is the backend URL with its host and port."""

    def __init__(
        self, program: str, backend_url: str, directory: Path, *, ignore_options: bool = False
    ) -> None:
        self.program = program
        self.backend = make_url(backend_url)
        self.directory = directory
        self.ignore_options = ignore_options
        self.port = 0
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of the database through this PgBouncer."""
        return self.backend.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False
        )

    def log(self) -> str:
        """What PgBouncer wrote so far."""
        path = self.directory / "pgbouncer.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def start(self) -> None:
        """Start it on a free port and wait until it accepts connections."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a port found free may be taken before PgBouncer binds it
            self.port = free_ports()
            self._popen = self._spawn(self._write_config())
            if self._wait_until_listening():
                return
        raise RuntimeError(f"pgbouncer did not start:\n{self.log()}")

    def stop(self) -> None:
        """Stop it; killed when in-flight transactions keep it waiting too long."""
        if self._popen is None or self._popen.poll() is not None:
            return
        # SIGINT means the same in every version (shut down once in-flight transactions end);
        # SIGTERM went from an immediate exit to waiting for every client in 1.23.
        self._popen.send_signal(signal.SIGINT)
        try:
            self._popen.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait(timeout=STOP_TIMEOUT_SECONDS)

    def _write_config(self) -> Path:
        backend = self.backend
        target = f"host={backend.host or '127.0.0.1'} port={backend.port or 5432}"
        target += f" dbname={backend.database} user={backend.username or 'postgres'}"
        if backend.password:
            target += f" password={backend.password}"
        ignored = "options" if self.ignore_options else ""
        config = self.directory / "pgbouncer.ini"
        config.write_text(
            f"""[databases]
{backend.database} = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 500
ignore_startup_parameters = {ignored}
""",
            encoding="utf-8",
        )
        return config

    def _spawn(self, config: Path) -> subprocess.Popen[bytes]:
        # PgBouncer refuses to run as root; it reads its configuration before switching user.
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with (self.directory / "pgbouncer.log").open("ab") as log:
            return subprocess.Popen(
                [self.program, *user, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_until_listening(self) -> bool:
        assert self._popen is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                time.sleep(POLL_SECONDS)
                continue
            return True
        self._popen.kill()
        self._popen.wait(timeout=STOP_TIMEOUT_SECONDS)
        return False
