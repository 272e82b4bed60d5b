"""Running the real ``outbox`` command in subprocesses, and reading what its handlers recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tests.acceptance import cli_app

ROOT = Path(__file__).resolve().parents[2]
OUTBOX = Path(sys.executable).parent / "outbox"
APP = "tests.acceptance.cli_app:app"
# Short enough for the tests' time budget, long enough that a healthy worker always renews it.
LEASE = ("--lease", "2", "--poll-interval", "0.2")

RUN_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Result:
    """How a finished ``outbox`` command ended."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together."""
        return self.stdout + self.stderr


class Running:
    """An ``outbox`` command running in the background; its output goes to files."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> None:
        self.popen = popen
        self._stdout = stdout
        self._stderr = stderr

    def send(self, signum: signal.Signals) -> None:
        """Send a signal to the process."""
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit code (negative: killed by that signal)."""
        return self.popen.wait(timeout=timeout)

    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        return self._stderr.read_text(encoding="utf-8", errors="replace")

    def result(self, timeout: float = RUN_TIMEOUT_SECONDS) -> Result:
        """Wait for the process to exit and return how it ended."""
        code = self.wait(timeout)
        return Result(code, self._stdout.read_text(encoding="utf-8"), self.stderr())


class Cli:
    """Starts ``outbox`` commands with a clean environment; kills whatever is left at the end."""

    def __init__(self, workdir: Path, output_dir: Path) -> None:
        self.workdir = workdir
        self.output_dir = output_dir
        self._started: list[Running] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a command: the test's own, minus any OUTBOX_* setting."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        env.update(PYTHONUNBUFFERED="1", **{cli_app.OUTPUT_DIR_ENV: str(self.output_dir)})
        env.update(extra or {})
        return env

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        timeout: float = RUN_TIMEOUT_SECONDS,
    ) -> Result:
        """Run a command to its end."""
        done = subprocess.run(
            [str(OUTBOX), *args],
            cwd=cwd,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        return Result(
            done.returncode,
            done.stdout.decode("utf-8", errors="replace"),
            done.stderr.decode("utf-8", errors="replace"),
        )

    def start(self, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Running:
        """Start a command in the background."""
        n = len(self._started)
        stdout = self.workdir / f"outbox-{n}.stdout"
        stderr = self.workdir / f"outbox-{n}.stderr"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            popen = subprocess.Popen(
                [str(OUTBOX), *args],
                cwd=cwd,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        running = Running(popen, stdout, stderr)
        self._started.append(running)
        return running

    def close(self) -> None:
        """Kill every command still running."""
        for running in self._started:
            if running.popen.poll() is None:
                running.popen.kill()
                running.popen.wait(timeout=10)


class Line(NamedTuple):
    """A line a test handler wrote: which batch, and the event or the time it started."""

    handler: str
    group_id: str
    attempt: int
    pid: int
    value: str
    """handled.log: the event id; started.log: the Unix time the batch started."""


def read_lines(output_dir: Path, name: str) -> list[Line]:
    """The lines of one of the handlers' logs (none when it does not exist yet)."""
    path = output_dir / name
    if not path.exists():
        return []
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        handler, group_id, attempt, pid, value = text.split()
        lines.append(Line(handler, group_id, int(attempt), int(pid), value))
    return lines


def started(output_dir: Path) -> list[Line]:
    """One line per batch a handler started."""
    return read_lines(output_dir, cli_app.STARTED_LOG)


def handled(output_dir: Path) -> list[Line]:
    """One line per event a handler finished with."""
    return read_lines(output_dir, cli_app.HANDLED_LOG)


def handled_ids(output_dir: Path, handler: str = "record_activity") -> list[int]:
    """The ids of the events one handler finished with, once per time it did."""
    return sorted(int(line.value) for line in handled(output_dir) if line.handler == handler)


def start_work(cli: Cli, url: str, *args: str, env: dict[str, str] | None = None) -> Running:
    """Start ``outbox work`` on the test application with the tests' short lease."""
    return cli.start("--app", APP, "--database-url", url, "work", *LEASE, *args, env=env)
