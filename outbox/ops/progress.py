"""How a long operation says how far it is, and how its caller stops it between batches.

The operations that work through many rows a batch at a time (:func:`outbox.ops.archive.prune`
and :func:`~outbox.ops.replay.replay`, :func:`outbox.ops.group_operations.discard` and
:func:`~outbox.ops.group_operations.replay`, :func:`outbox.ops.fanout.backfill`,
:func:`outbox.ops.migrate.migrate`, :func:`outbox.ops.reindex.reindex`)
take a :class:`Progress`. They tell it what they are about to do and how much of it there is,
each batch once it is committed, and ask it before each batch whether to go on. Told to stop,
they raise :class:`StoppedError` between two batches: every batch is committed whole or not at
all, and the error says how far the operation got.

The library draws nothing: the ``outbox`` command draws a bar on a terminal and logs the counts
elsewhere; an application may report them its own way.
"""

from __future__ import annotations

from outbox.exceptions import OutboxError

__all__ = ["COUNT_CAP", "Progress", "StoppedError"]

COUNT_CAP = 1_000_000
"""Rows an operation counts, at most, before it begins, to say how many there are: a count
costs work in proportion to what it counts, and past this many an operation tells its
:class:`Progress` the total is not known (``None``) rather than count them all."""


class Progress:
    """Told of a long operation's batches as they commit; asked between them whether to stop.

    The methods of this base do nothing and never ask to stop: subclass it and override those
    you need. Each is called from the thread running the operation.
    """

    def begin(self, verb: str, noun: str, total: int | None) -> None:
        """A part of the operation begins: ``total`` ``noun`` to be ``verb`` (``"pruned"``,
        ``"archive rows"``, 100000); ``total`` None: more than could be counted cheaply."""

    def advance(self, done: int) -> None:
        """``done`` more of them are committed."""

    def end(self) -> None:
        """The part begun last is done (an operation stopped, or failed, does not say so)."""

    def should_stop(self) -> bool:
        """Whether the operation should stop before its next batch."""
        return False


class StoppedError(OutboxError):
    """A long operation stopped between two batches because its :class:`Progress` asked it
    to: the batches before are committed, the rest are not begun. Running it again with the
    same arguments goes on with the rest."""

    def __init__(
        self,
        verb: str,
        noun: str,
        done: int,
        total: int | None,
        *,
        operation_id: int | None = None,
    ) -> None:
        self.verb = verb
        self.noun = noun
        self.done = done
        self.total = total
        self.operation_id = operation_id
        super().__init__(f"{self.summary}; stopped before the rest")

    @property
    def summary(self) -> str:
        """What was done, in a few words: ``pruned 40,000 of 100,000 archive rows``."""
        of = "" if self.total is None else f" of {self.total:,}"
        record = "" if self.operation_id is None else f" (operation {self.operation_id})"
        return f"{self.verb} {self.done:,}{of} {self.noun}{record}"


class Phase:
    """One part of an operation as its :class:`Progress` sees it: what it counts, how many
    are done, and the check between batches. Internal to outbox's operations."""

    def __init__(self, progress: Progress | None, verb: str, noun: str, total: int | None) -> None:
        self.progress = progress or Progress()
        self.verb = verb
        self.noun = noun
        self.total = total
        self.done = 0
        self.progress.begin(verb, noun, total)

    def advance(self, done: int) -> None:
        """``done`` more are committed."""
        self.done += done
        if done:
            self.progress.advance(done)

    def end(self) -> None:
        """The part is done."""
        self.progress.end()

    def check(self, operation_id: int | None = None) -> None:
        """Raise :class:`StoppedError` when the progress asks to stop; call it before a
        batch, never inside one."""
        if self.progress.should_stop():
            raise StoppedError(
                self.verb, self.noun, self.done, self.total, operation_id=operation_id
            )


def capped(count: int, cap: int = COUNT_CAP) -> int | None:
    """A count made with a cap as a total: None when it reached the cap (more than that)."""
    return None if count >= cap else count
