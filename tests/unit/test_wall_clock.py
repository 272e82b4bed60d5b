"""outbox compares points in time by the database's clock: a host whose clock is minutes wrong
must change nothing (tests/network/test_partitions.py shows it across hosts). In the process,
the wall clock is read in the few places listed here, each for a reason of its own; any other
reading goes through ``outbox._db.database_clock``, the process's reading of the database's
clock."""

from __future__ import annotations

import re
from pathlib import Path

import outbox

WALL_CLOCK = re.compile(r"datetime\.now\(|datetime\.today\(|utcnow\(|\btime\.time(_ns)?\(\)")
QUOTED = re.compile(r"``[^`]*``")  # a docstring's mention is no reading
READERS = {
    # Shown to an operator: the console's "3 min ago" and "as of", by its own host's clock.
    "web/_console.py",
    "web/_databases.py",
    "web/_render.py",
    # A downstream's Retry-After date, set by the downstream's clock, read against this host's
    # as HTTP clients read it.
    "retry.py",
    # The tick a Celery beat's message names: one sender's clock names them all.
    "executors/celery/messages.py",
}


def test_the_wall_clock_is_read_only_where_listed() -> None:
    package = Path(outbox.__file__).parent
    reading = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if WALL_CLOCK.search(QUOTED.sub("", path.read_text(encoding="utf-8")))
    }
    assert READERS == reading
