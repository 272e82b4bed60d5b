"""What the run-once calls of :mod:`outbox.once` return: frozen results to branch on, each
with a one-line ``summary()``, which print as JSON through :func:`outbox.jsonable`.
Users import them from :mod:`outbox.once`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from outbox.ops.scaling import Scaling


class Stopped(StrEnum):
    """Why :func:`outbox.once.work_once` stopped starting jobs."""

    IDLE = "idle"
    """No job was due now."""
    BUDGET = "budget"
    """Its time budget was spent; jobs may still be due."""
    MAX_GROUPS = "max_groups"
    """It ran the most groups it was given; jobs may still be due."""
    STOPPED = "stopped"
    """Asked to stop: by its caller (``stop``: a SIGTERM, an application shutting down), or
    by an operator (``outbox workers drain|stop``, read at its heartbeat)."""
    UNHEARD = "unheard"
    """Its heartbeats had not got through for two and a half intervals (a slow or cut network
    to the database): the fleet could take it for gone, so it took nothing more."""


@dataclass(frozen=True, slots=True)
class HandlerDistribution:
    """What one distribution call did for one handler."""

    handler: str
    won: bool
    """This call distributed for the handler: it took the tick (or was given no ``every``).
    False: another caller had already taken this tick (or a later one), and distributed."""
    enqueued: int
    """Claim jobs this call enqueued (0 when it lost the tick)."""
    unclaimed: int | None
    """Unclaimed events counted, at most a few batches' worth; None when the tick was lost."""


@dataclass(frozen=True, slots=True)
class DistributionResult:
    """What :func:`outbox.once.distribute_once` did."""

    every: float | None
    """The schedule's interval in seconds; None: no tick, every call distributes."""
    tick: int | None
    """The tick taken or lost, named by its start in whole milliseconds since the Unix epoch
    by the database's clock; None without ``every``."""
    handlers: tuple[HandlerDistribution, ...]

    @property
    def won(self) -> list[str]:
        """The handlers this call distributed for."""
        return [h.handler for h in self.handlers if h.won]

    @property
    def lost(self) -> list[str]:
        """The handlers another caller had distributed for on this tick."""
        return [h.handler for h in self.handlers if not h.won]

    @property
    def enqueued(self) -> int:
        """Claim jobs this call enqueued, for every handler."""
        return sum(h.enqueued for h in self.handlers)

    def summary(self) -> str:
        """One line: what was distributed, and the tick lost."""
        text = f"distributed for {len(self.won)} handlers, {self.enqueued} claim jobs enqueued"
        if self.lost:
            text += f"; tick taken by another caller for {len(self.lost)}"
        return text


@dataclass(frozen=True, slots=True)
class RescueResult:
    """What :func:`outbox.once.rescue_once` did."""

    rescued: int
    """Jobs freed whose leases had run out: due again, their attempt counted."""

    def summary(self) -> str:
        """One line."""
        return f"{self.rescued} jobs rescued"


@dataclass(frozen=True, slots=True)
class WorkResult:
    """What :func:`outbox.once.work_once` did, and what it left. Seconds are float seconds;
    ages and due times are read from the database's clock."""

    stopped: Stopped
    seconds: float
    """How long it worked."""
    groups_succeeded: int
    groups_failed: int
    """Groups whose attempt failed and that will be tried again."""
    groups_deferred: int
    """Groups put off for the downstream's ``Retry-After`` (no attempt counted)."""
    groups_dead: int
    """Groups dead-lettered into the archive: an operator's to look at."""
    groups_throttled: int
    """Groups a rate limit gave back to wait for their turn (no attempt counted)."""
    groups_refused: int
    """Groups whose outcome the database refused to record: held (``outbox refused``)."""
    leases_lost: int
    """Jobs another worker had taken by the time this one finished them: nothing written."""
    events_succeeded: int
    backlog: int
    """Events left in the handlers' buffers, unclaimed or in groups (counted up to
    ``BACKLOG_COUNT_CAP`` per handler)."""
    backlog_capped: bool
    """A handler's count stopped at the cap: the backlog is at least ``backlog``."""
    oldest_age: float | None
    """Seconds since the oldest event left was written; None when the buffers are empty."""
    next_due_in: float | None
    """Seconds until work is due (0: now, when events wait for a distribution or a job is
    due); None when nothing waits. A paused handler's work does not count; a job another
    worker holds is that worker's."""

    @property
    def groups(self) -> int:
        """Groups this call ran, whatever became of them."""
        return (
            self.groups_succeeded
            + self.groups_failed
            + self.groups_deferred
            + self.groups_dead
            + self.groups_throttled
            + self.groups_refused
            + self.leases_lost
        )

    @property
    def needs_operator(self) -> bool:
        """Groups were dead-lettered or held as refused: someone should look."""
        return bool(self.groups_dead or self.groups_refused)

    def summary(self) -> str:
        """One line: the groups, why it stopped, and what is left."""
        text = (
            f"{self.groups_succeeded} groups succeeded, {self.groups_failed} failed, "
            f"{self.groups_deferred} deferred, {self.groups_dead} dead"
        )
        if self.groups_refused:
            text += f", {self.groups_refused} refused"
        text += f" ({self.stopped.value}, {self.seconds:.1f} s); "
        more = "+" if self.backlog_capped else ""
        text += f"{self.backlog}{more} events left"
        if self.oldest_age is not None:
            text += f", the oldest {self.oldest_age:.1f} s old"
        if self.next_due_in is not None:
            text += f", next due in {self.next_due_in:.1f} s"
        return text


@dataclass(frozen=True, slots=True)
class RunResult:
    """What :func:`outbox.once.run_once` did: its rescue, its distribution and its work; and
    what the fleet should be now (:func:`outbox.ops.scaling.read_scaling`), read after the work."""

    rescue: RescueResult
    distribution: DistributionResult
    work: WorkResult
    scaling: Scaling

    @property
    def desired_workers(self) -> int:
        """Worker slots that keep every band's promise with the backlog left (never 0 while a
        lease is live or runnable work waits): what an autoscaler, or a scheduler deciding
        whether to call again sooner or start more callers, follows."""
        return self.scaling.desired_workers

    @property
    def needs_operator(self) -> bool:
        """Groups were dead-lettered or held as refused in this run: someone should look."""
        return self.work.needs_operator

    @property
    def next_due_in(self) -> float | None:
        """Seconds until work is due (see :attr:`WorkResult.next_due_in`)."""
        return self.work.next_due_in

    def summary(self) -> str:
        """One line for a cron log."""
        return "; ".join((self.rescue.summary(), self.distribution.summary(), self.work.summary()))
