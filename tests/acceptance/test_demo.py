"""``outbox demo``: the whole pipeline on a throwaway SQLite file, from an empty directory."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.acceptance._cli import Cli


@pytest.fixture
def temp_dir(tmp_path: Path) -> Path:
    """The TMPDIR the demo runs with, so that whatever it leaves there stays inside the test."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    """An empty working directory."""
    path = tmp_path / "cwd"
    path.mkdir()
    return path


def test_demo_in_an_empty_directory_drains_every_committed_event(
    cli: Cli, empty_dir: Path, temp_dir: Path
) -> None:
    """``outbox demo`` exits 0 and its summary shows the events committed and none left."""
    result = cli.run("demo", cwd=empty_dir, env={"TMPDIR": str(temp_dir)})

    committed = re.search(r"^  events committed +(\d+)$", result.stdout, flags=re.MULTILINE)
    left = re.search(r"^  events left in buffer +(\d+)$", result.stdout, flags=re.MULTILINE)
    assert (0, "5000", "0", []) == (
        result.code,
        committed and committed.group(1),
        left and left.group(1),
        list(empty_dir.iterdir()),
    )


def test_demo_leaves_no_files_behind(cli: Cli, empty_dir: Path, temp_dir: Path) -> None:
    """The demo's throwaway database is removed when the demo ends."""
    result = cli.run("demo", "--events", "100", cwd=empty_dir, env={"TMPDIR": str(temp_dir)})

    assert (0, []) == (result.code, sorted(p.name for p in temp_dir.rglob("*")))


def test_interrupted_demo_leaves_no_files_behind(cli: Cli, empty_dir: Path, temp_dir: Path) -> None:
    """Ctrl-C while the demo drains: it stops, and its throwaway database goes with it."""
    running = cli.start("demo", "--events", "200000", cwd=empty_dir, env={"TMPDIR": str(temp_dir)})
    deadline = time.monotonic() + 30
    while not list(temp_dir.rglob("*.sqlite3")) and time.monotonic() < deadline:
        time.sleep(0.05)
    created = [p.name for p in temp_dir.rglob("*.sqlite3")]
    running.send(signal.SIGINT)
    running.wait(30)
    assert (["demo.sqlite3"], []) == (created, sorted(p.name for p in temp_dir.rglob("*")))
