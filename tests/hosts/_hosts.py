"""A host process (a Celery worker, uvicorn, Flask) started for a test, its log in a file."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance._cli import ROOT

STOP_TIMEOUT_SECONDS = 30.0


@dataclass
class Host:
    """A running host: its process, its environment, and the file its output goes to."""

    popen: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path

    def output(self) -> str:
        """Everything it wrote, stdout and stderr together, in the order written."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Ask it to stop and wait until it has (killed past the timeout); again is a no-op."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signum)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=STOP_TIMEOUT_SECONDS)


def start(args: list[str], log: Path, env: dict[str, str]) -> Host:
    """Start ``args`` from the repository's root with ``env`` added to the test's own
    environment (less any OUTBOX_* setting); stdout and stderr both go to ``log``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    full.update(PYTHONUNBUFFERED="1", **env)
    with log.open("wb") as out:
        popen = subprocess.Popen(
            args, cwd=ROOT, env=full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    return Host(popen, full, log)
