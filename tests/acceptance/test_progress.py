"""Long commands say how far they are (a bar on a terminal, log lines otherwise), and a Ctrl-C
stops them between two batches, saying what was done and what was not."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.engine import make_url

from outbox import schema
from outbox._core import log as _log
from outbox._db.dialects import db_now_plus
from outbox.cli._errors import EXIT_INTERRUPTED
from outbox.cli._progress import PROGRESS_INTERVAL_ENV
from outbox.ops.groups import COUNT_CAP
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import APP, OUTBOX, ROOT, Cli, Result
from tests.models import ActivityEvent

CHUNK = 5
"""Rows (groups) per transaction of the interrupted runs: a run stopped after one has more
to do."""
SQLITE_AND_POSTGRESQL = pytest.mark.parametrize(
    "database_url", ["sqlite", "postgresql"], indirect=True
)


def _archive(engine: Engine, status: str, count: int) -> None:
    """``count`` archive rows of ``status``, archived an hour ago, each its own group, whose
    payloads replay into the activity buffer."""
    rows = [
        {
            "handler": "record_activity",
            "buffer": ActivityEvent.__table__.name,
            "event_id": n + 1,
            "group_id": uuid.uuid4(),
            "status": status,
            "attempts": 1,
            "error": "boom",
            "payload": {"activity_id": n, "kind": "viewed"},
        }
        for n in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.archive).values(archived_at=db_now_plus(-3600)), rows)


def _archived(engine: Engine, status: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.count()).where(schema.archive.c.status == status)).scalar_one()
        )


@contextmanager
def _writes_held(engine: Engine, url: str) -> Iterator[None]:
    """No other connection writes the archive until the block ends (SQLite: the database's
    write lock; PostgreSQL: a SHARE lock on outbox_archive): a command writing it waits in
    the middle of its batch."""
    if engine.dialect.name == "sqlite":
        database = make_url(url).database
        assert database is not None
        held = sqlite3.connect(database, isolation_level=None)
        try:
            held.execute("BEGIN IMMEDIATE")
            yield
            held.execute("ROLLBACK")
        finally:
            held.close()
        return
    with engine.connect() as conn:
        conn.execute(text(f"LOCK TABLE {schema.archive.name} IN SHARE MODE"))
        yield
        conn.rollback()


def _waiting_for_a_lock(engine: Engine) -> bool:
    """Whether a session of the database waits for a lock (PostgreSQL)."""
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return bool(waiting)


def _progress(stderr: str) -> list[dict[str, Any]]:
    """The ``outbox.progress`` lines a command logged."""
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == _log.PROGRESS]


def _interrupt(
    cli: Cli, engine: Engine, url: str, args: tuple[str, ...], taken: Callable[[], int]
) -> tuple[Result, int]:
    """Run ``outbox args`` and send it SIGINT while it waits in the middle of a batch for
    the archive's writes, held by the test; how it ended, and how many rows it had ``taken``
    before the SIGINT.

    PostgreSQL: the writes are held from the start, and SIGINT sent once the command has
    begun (its first progress line): it waits in its first batch. SQLite takes its write lock
    for reads too: the lock is taken once a first batch is done (the run is long enough not to
    have ended by then), and the command waits at the start of the batch after.
    """
    env = {PROGRESS_INTERVAL_ENV: "0"}
    command = ("--app", APP, "--database-url", url, *args)
    if engine.dialect.name != "sqlite":
        with _writes_held(engine, url):
            running = cli.start(*command, env=env)
            wait_for(lambda: _progress(running.stderr()), f"{args[0]} to begin")
            # Its first line comes before its first batch: signalled before the batch waits,
            # it would stop with nothing under way.
            wait_for(lambda: _waiting_for_a_lock(engine), f"{args[0]}'s batch to wait")
            running.send(signal.SIGINT)
        return running.result(), 0
    running = cli.start(*command, env=env)
    wait_for(
        lambda: any(line["done"] for line in _progress(running.stderr())), f"{args[0]}'s batch"
    )
    with _writes_held(engine, url):
        before = taken()
        running.send(signal.SIGINT)
    return running.result(), before


def _rows(engine: Engine) -> int:
    """Archive rows the interrupted runs begin with: SQLite's run must outlast the test's
    reaction to its first batch."""
    return 20_000 if engine.dialect.name == "sqlite" else 60


@SQLITE_AND_POSTGRESQL
def test_prune_stopped_by_ctrl_c_deletes_the_chunk_under_way_whole_and_no_other(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """SIGINT in the middle of a prune: the chunk under way is deleted whole, no other after
    it; the command says how many of how many it deleted, and exits 130."""
    engine = connect(database_url)
    rows = _rows(engine)
    _archive(engine, "succeeded", rows)

    result, before = _interrupt(
        cli, engine, database_url, ("prune", "--older-than", "1m", "--chunk", str(CHUNK)),
        lambda: rows - _archived(engine, "succeeded"),
    )  # fmt: skip

    pruned = rows - _archived(engine, "succeeded")
    expected = (
        f"pruned {pruned:,} of {rows:,} archive rows; stopped by Ctrl-C before the rest; "
        "run it again to go on"
    )
    assert (EXIT_INTERRUPTED, expected, True, "") == (
        result.code,
        result.stderr.strip().splitlines()[-1],
        pruned in (before, before + CHUNK) and pruned > 0,
        result.stdout,
    ), (before, pruned)


@SQLITE_AND_POSTGRESQL
def test_prune_run_again_after_ctrl_c_deletes_the_rest(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """A prune stopped by Ctrl-C, run again, deletes the rows the first left."""
    engine = connect(database_url)
    rows = _rows(engine)
    _archive(engine, "succeeded", rows)
    args = ("prune", "--older-than", "1m", "--chunk", str(CHUNK))
    _interrupt(cli, engine, database_url, args, lambda: rows - _archived(engine, "succeeded"))
    left = _archived(engine, "succeeded")

    again = cli.run("--app", APP, "--database-url", database_url, *args)

    assert (0, f"pruned {left} archive rows, 0 idle rate limits", 0) == (
        again.code,
        again.stdout.strip(),
        _archived(engine, "succeeded"),
    )


@SQLITE_AND_POSTGRESQL
def test_replay_stopped_by_ctrl_c_leaves_its_record_counting_what_it_replayed(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """SIGINT in the middle of a replay: whole chunks of events are back in their buffer,
    the others still dead, and the operation's record counts exactly those put back, as the
    command says."""
    engine = connect(database_url)
    rows = _rows(engine)
    _archive(engine, "dead", rows)

    result, before = _interrupt(
        cli, engine, database_url, ("replay", "--status", "dead", "--chunk", str(CHUNK)),
        lambda: _archived(engine, "replayed"),
    )  # fmt: skip

    replayed = _archived(engine, "replayed")
    (operation,) = _operations(engine)
    expected = (
        f"replayed {replayed:,} of {rows:,} events (operation {operation['id']}); stopped by "
        "Ctrl-C before the rest; run it again to go on"
    )
    assert (EXIT_INTERRUPTED, expected, True, replayed, replayed, rows - replayed) == (
        result.code,
        result.stderr.strip().splitlines()[-1],
        replayed in (before, before + CHUNK) and replayed > 0,
        operation["events"],
        len(_tables.buffer_rows(engine)),
        _archived(engine, "dead"),
    ), (before, replayed)


@SQLITE_AND_POSTGRESQL
def test_discard_stopped_by_ctrl_c_leaves_its_record_counting_what_it_discarded(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """SIGINT in the middle of a discard: whole pages of groups discarded, the others still
    dead, and the operation's record counts exactly those, as the command says."""
    engine = connect(database_url)
    rows = _rows(engine)
    _archive(engine, "dead", rows)

    result, before = _interrupt(
        cli, engine, database_url, ("discard", "--status", "dead", "--chunk", str(CHUNK)),
        lambda: _archived(engine, "discarded"),
    )  # fmt: skip

    discarded = _archived(engine, "discarded")
    (operation,) = _operations(engine)
    expected = (
        f"discarded {discarded:,}{_of(rows)} groups (operation {operation['id']}); "
        "stopped by Ctrl-C before the rest; run it again to go on"
    )
    assert (EXIT_INTERRUPTED, expected, True, (discarded,) * 2, rows - discarded) == (
        result.code,
        result.stderr.strip().splitlines()[-1],
        discarded in (before, before + CHUNK) and discarded > 0,
        (operation["groups"], operation["events"]),
        _archived(engine, "dead"),
    ), (before, discarded)


def _of(groups: int) -> str:
    """The total a discard's message names: groups are counted up to the listings' cap."""
    return f" of {groups:,}" if groups < COUNT_CAP else ""


def _operations(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(schema.operations))]


@SQLITE_AND_POSTGRESQL
def test_prune_off_a_terminal_logs_its_counts_as_json_lines_on_stderr(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """Without a terminal, a prune logs ``outbox.progress`` JSON lines on stderr (here after
    every chunk: OUTBOX_PROGRESS_INTERVAL=0) and keeps stdout for its answer."""
    engine = connect(database_url)
    _archive(engine, "succeeded", 30)

    result = cli.run(
        "--database-url", database_url, "prune", "--older-than", "1m", "--chunk", "10",
        env={PROGRESS_INTERVAL_ENV: "0"},
    )  # fmt: skip

    progress = [
        (line["command"], line["unit"], line["done"], line["total"])
        for line in _progress(result.stderr)
    ]
    counts = [("prune", "archive rows", done, 30) for done in (0, 10, 20, 30, 30)]
    assert (0, "pruned 30 archive rows, 0 idle rate limits", counts) == (
        result.code,
        result.stdout.strip(),
        progress,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_prune_quicker_than_the_interval_logs_no_progress(
    cli: Cli, database_url: str, connect: Callable[[str], Engine]
) -> None:
    """A prune that ends before the interval (10 s) logs no progress line."""
    engine = connect(database_url)
    _archive(engine, "succeeded", 30)

    result = cli.run("--database-url", database_url, "prune", "--older-than", "1m")

    assert (0, False) == (result.code, _log.PROGRESS in result.stderr)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_progress_interval_that_is_not_seconds_is_refused(cli: Cli, database_url: str) -> None:
    """OUTBOX_PROGRESS_INTERVAL=soon: exit 2, one line naming it; nothing pruned."""
    result = cli.run(
        "--database-url", database_url, "prune", "--older-than", "1m",
        env={PROGRESS_INTERVAL_ENV: "soon"},
    )  # fmt: skip

    expected = f"Error: {PROGRESS_INTERVAL_ENV}: expected seconds from 0 to 86,400, got 'soon'\n"
    assert (2, expected) == (result.code, result.stderr)


def _on_a_terminal(*args: str) -> tuple[int, str]:
    """Run ``outbox args`` with stdout and stderr on a pseudo-terminal; its exit code and
    all it wrote there."""
    parent, child = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    process = subprocess.Popen(
        [str(OUTBOX), *args],
        cwd=ROOT,
        env={**env, "COLUMNS": "120"},
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    written = b""
    try:
        while True:
            try:
                data = os.read(parent, 65536)
            except OSError:  # the terminal closed: the command has exited
                break
            if not data:
                break
            written += data
    finally:
        os.close(parent)
    return process.wait(timeout=60), written.decode("utf-8", errors="replace")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_prune_on_a_terminal_draws_a_bar_of_rows_done_of_the_count_and_the_rate(
    database_url: str, connect: Callable[[str], Engine]
) -> None:
    """On a terminal, a prune draws click's bar: the archive rows deleted of those counted,
    the percentage and the rate; no progress log line."""
    engine = connect(database_url)
    _archive(engine, "succeeded", 50)

    code, written = _on_a_terminal(
        "--database-url", database_url, "prune", "--older-than", "1m", "--chunk", "10"
    )

    last_bar = [part for part in written.split("\r") if "archive rows  [" in part][-1]
    assert (0, True, False, True) == (
        code,
        re.search(r"\[#+\]  50/50  100%  [\d,]+/s", last_bar) is not None,
        _log.PROGRESS in written,
        "pruned 50 archive rows, 0 idle rate limits" in written,
    ), written
