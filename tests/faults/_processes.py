"""``outbox`` commands in subprocesses for the fault suite, and polling helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from outbox import db_now, schema
from tests.faults.fault_app import HANDLED_DIR_ENV, FaultEvent

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.faults.fault_app:app"
# This checkout's ``outbox``, run by the interpreter running the tests.
PROGRAM = (sys.executable, "-m", "outbox")


def environment(
    handled_dir: Path,
    extra: dict[str, str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an ``outbox`` command: ``base`` (by default this one's), minus any
    OUTBOX_* setting."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("OUTBOX_")}
    env.update(PYTHONUNBUFFERED="1", **{HANDLED_DIR_ENV: str(handled_dir)})
    env.update(extra or {})
    return env


class OutboxProcess:
    """One ``outbox --app tests.faults.fault_app:app ...`` command in the background.

    Its stdout and stderr go to ``<log_dir>/<name>.stdout`` / ``.stderr``. ``program``, ``app``,
    ``cwd`` and ``base_env`` run another installation of outbox on another application (the
    upgrade tier runs an older release from its own virtual environment).
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
        program: Sequence[str] = PROGRAM,
        app: str = APP,
        cwd: Path = ROOT,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        command = [*program, "--app", app, "--database-url", url]
        with self.stdout_path.open("ab") as out, self.stderr_path.open("ab") as err:
            self.popen = subprocess.Popen(
                [*command, "--log-format", "json", *args],
                cwd=cwd,
                env=environment(handled_dir, env, base=base_env),
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

    def stdout(self) -> str:
        """What it wrote to stdout so far."""
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")


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


def drained(engine: Engine, event_model: type[Any] = FaultEvent) -> bool:
    """True when the buffer (of ``event_model``) and the job table are both empty."""
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(event_model.__table__)).scalar_one()
        jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    return rows == 0 and jobs == 0
