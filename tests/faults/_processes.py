"""``outbox`` commands in subprocesses for the fault suite, and polling helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, func, select

from outbox import db_now, schema
from tests.faults.fault_app import HANDLED_DIR_ENV, FaultEvent

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.faults.fault_app:app"


def environment(handled_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an ``outbox`` command: this one's, minus any OUTBOX_* setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(PYTHONUNBUFFERED="1", **{HANDLED_DIR_ENV: str(handled_dir)})
    env.update(extra or {})
    return env


class OutboxProcess:
    """One ``outbox --app tests.faults.fault_app:app ...`` command in the background.

    Its stdout and stderr go to ``<log_dir>/<name>.stdout`` / ``.stderr``.
    """

    def __init__(
        self,
        name: str,
        url: str,
        args: list[str],
        *,
        handled_dir: Path,
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        command = [sys.executable, "-m", "outbox", "--app", APP, "--database-url", url]
        with self.stdout_path.open("ab") as out, self.stderr_path.open("ab") as err:
            self.popen = subprocess.Popen(
                [*command, "--log-format", "json", *args],
                cwd=ROOT,
                env=environment(handled_dir, env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        self.paused = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        """Send a signal, unless the process has already exited."""
        if self.alive():
            self.popen.send_signal(signum)
        if signum == signal.SIGSTOP:
            self.paused = True
        elif signum == signal.SIGCONT:
            self.paused = False

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit code (negative: killed by that signal)."""
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (after SIGCONT, if paused), then SIGKILL if it does not exit in time."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(timeout=10)

    def kill(self) -> int:
        """SIGKILL; the exit code."""
        if self.alive():
            self.popen.kill()
        return self.popen.wait(timeout=10)

    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


def run_outbox(
    url: str, args: list[str], *, handled_dir: Path, log_dir: Path, name: str, timeout: float
) -> int:
    """Run an ``outbox`` command to its end; its exit code."""
    process = OutboxProcess(name, url, args, handled_dir=handled_dir, log_dir=log_dir)
    try:
        return process.wait(timeout)
    finally:
        process.kill()


def live_leases(engine: Engine) -> int:
    """Jobs whose lease has not run out yet, by the database clock."""
    jobs = schema.jobs
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    jobs.c.lease_token.is_not(None),
                    jobs.c.lease_expires_at >= db_now(),
                )
            ).scalar_one()
        )


def drained(engine: Engine) -> bool:
    """True when the buffer and the job table are both empty."""
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(FaultEvent.__table__)).scalar_one()
        jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    return rows == 0 and jobs == 0
