"""How far a long command is: a bar on a terminal, the counts logged otherwise; a Ctrl-C stops
it between two batches (:func:`reporting`)."""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from outbox._core import log as _log
from outbox.cli._errors import exit_interrupted
from outbox.cli._signals import interrupt_flag
from outbox.exceptions import ConfigurationError
from outbox.ops.progress import Progress

log = _log.get_logger(__name__)

PROGRESS_INTERVAL_SECONDS = 10.0
"""Off a terminal, the counts are logged once per this many seconds (as a batch ends: a long
batch makes a longer gap), and once more as the part ends if any were: a command quicker than
this logs none. ``OUTBOX_PROGRESS_INTERVAL`` sets another (0: at the start, after every batch
and at the end)."""
PROGRESS_INTERVAL_ENV = "OUTBOX_PROGRESS_INTERVAL"
MAX_PROGRESS_INTERVAL_SECONDS = 86_400.0


class CommandProgress(Progress):
    """A command's :class:`~outbox.ops.progress.Progress`: click's bar on stderr when stderr is a
    terminal (done of the count, rate, time left), else an ``outbox.progress`` log line (JSON
    off a terminal) at intervals; it asks to stop once ``interrupted`` is set."""

    def __init__(
        self,
        command: str,
        interrupted: threading.Event,
        *,
        terminal: bool,
        interval: float = PROGRESS_INTERVAL_SECONDS,
    ) -> None:
        self.command = command
        self.interrupted = interrupted
        self.terminal = terminal
        self.interval = interval
        self.verb = ""
        self.noun = ""
        self.total: int | None = None
        self.done = 0
        self._started: float | None = None
        self._logged = 0.0
        self._lines = 0
        self._bar: Any = None

    def begin(self, verb: str, noun: str, total: int | None) -> None:
        self.close()
        self.verb, self.noun, self.total, self.done = verb, noun, total, 0
        self._started = self._logged = time.monotonic()
        self._lines = 0
        if total == 0:
            return  # nothing to do (tables up to date, say): nothing to show
        if self.terminal:
            self._bar = click.progressbar(
                # Not counted: an iterable of no known length makes click show rows done only.
                iterable=None if total is not None else (n for n in itertools.count()),
                length=total,
                label=noun,
                file=sys.stderr,
                show_pos=True,
                show_percent=total is not None,
                show_eta=True,
                item_show_func=lambda _: self._rate_text(),
            )
            self._bar.__enter__()
        elif self.interval == 0:
            self._log()

    def advance(self, done: int) -> None:
        self.done += done
        if self._bar is not None:
            self._bar.update(done)
            if self.total is not None and self.done >= self.total:
                self._end_bar()  # ended: what the operation says next starts on a line of its own
        elif not self.terminal and time.monotonic() - self._logged >= self.interval:
            self._log()

    def end(self) -> None:
        self.close()

    def should_stop(self) -> bool:
        return self.interrupted.is_set()

    def close(self) -> None:
        """End the part under way: the bar's last line, or the counts logged once more."""
        if self._started is None:
            return
        if self.terminal:
            self._end_bar()
        elif self._lines:
            self._log()
        self._started = None

    def _end_bar(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    @property
    def summary(self) -> str:
        """What the part under way did: ``pruned 40,000 of 100,000 archive rows``."""
        of = "" if self.total is None else f" of {self.total:,}"
        return f"{self.verb} {self.done:,}{of} {self.noun}"

    def _rate(self) -> float:
        elapsed = time.monotonic() - (self._started or time.monotonic())
        return self.done / elapsed if elapsed > 0 else 0.0

    def _rate_text(self) -> str:
        return f"{self._rate():,.0f}/s"

    def _log(self) -> None:
        self._logged = time.monotonic()
        self._lines += 1
        rate = self._rate()
        left = None
        if self.total is not None and rate > 0:
            left = round(max(self.total - self.done, 0) / rate, 1)
        log.info(
            _log.PROGRESS,
            command=self.command,
            unit=self.noun,
            done=self.done,
            total=self.total,
            per_second=round(rate, 1),
            seconds_left=left,
        )


@contextmanager
def reporting(command: str, *, dry_run: bool = False) -> Iterator[CommandProgress | None]:
    """A progress for ``command``'s operation, with Ctrl-C as its stop request: the operation
    raises :class:`~outbox.ops.progress.StoppedError` before its next batch (the command's error
    mapping says what was done and exits with :data:`EXIT_INTERRUPTED`). A second Ctrl-C stops
    at once, in the middle of a batch, which its transaction commits whole or not at all.

    ``dry_run``: none (a dry run changes nothing, and Ctrl-C ends it as any command)."""
    if dry_run:
        yield None
        return
    interval = _interval()
    with interrupt_flag() as interrupted:
        progress = CommandProgress(
            command, interrupted, terminal=sys.stderr.isatty(), interval=interval
        )
        try:
            yield progress
        except KeyboardInterrupt:
            progress.close()
            if not progress.verb:
                exit_interrupted("nothing done: stopped by Ctrl-C twice before it began")
            exit_interrupted(
                f"{progress.summary}, then a second Ctrl-C stopped it during a batch (a batch "
                "commits whole or not at all)"
            )
        finally:
            progress.close()


def _interval() -> float:
    """The interval of the progress lines: ``OUTBOX_PROGRESS_INTERVAL`` seconds, if set."""
    given = os.environ.get(PROGRESS_INTERVAL_ENV)
    if not given:
        return PROGRESS_INTERVAL_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_PROGRESS_INTERVAL_SECONDS:
        raise ConfigurationError(
            f"{PROGRESS_INTERVAL_ENV}: expected seconds from 0 to "
            f"{MAX_PROGRESS_INTERVAL_SECONDS:,.0f}, got {given!r}"
        )
    return seconds
