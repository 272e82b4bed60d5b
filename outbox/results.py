"""What became of a batch job: the value a worker records, counts, logs and hands to
``Worker(on_result=...)``."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """What became of one batch job."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    """The attempt failed; the next one is scheduled."""
    DEFERRED = "deferred"
    """The downstream said when to come back (:class:`outbox.RetryAfter`): the next attempt
    is scheduled then, and this one is not counted."""
    THROTTLED = "throttled"
    """The handler's rate limit had no turn for the group soon enough: it was not handed over,
    and waits for its turn (no attempt counted)."""
    DEAD = "dead"
    LEASE_LOST = "lease_lost"
    """Another worker had taken the job: nothing was changed."""
    REFUSED = "refused"
    """The database refused to record the outcome for good: the group is held."""


class FailureCause(StrEnum):
    """What caused a failed attempt: what a circuit breaker counts, and what it does not."""

    DOWNSTREAM = "downstream"
    """The downstream failed (or the handler did not say): counted by a circuit breaker."""
    DATA = "data"
    """The events caused it (:class:`outbox.DataError`, or a group bisection is isolating a
    poison event in): not counted by a circuit breaker."""


SUCCEEDED, RETRYING, DEAD = Outcome.SUCCEEDED, Outcome.RETRYING, Outcome.DEAD
DEFERRED, THROTTLED = Outcome.DEFERRED, Outcome.THROTTLED
LEASE_LOST, REFUSED = Outcome.LEASE_LOST, Outcome.REFUSED


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What became of one batch job."""

    handler: str
    group_id: uuid.UUID
    attempt: int
    outcome: Outcome
    size: int = 0
    succeeded: int = 0
    retried: int = 0
    deferred: int = 0
    """Events retried with ``after`` (:meth:`outbox.Batch.retry`), or the whole group's when
    the outcome is ``deferred``."""
    discarded: int = 0
    dead: int = 0
    expired: int = 0
    superseded: int = 0
    """Events a later event of their key stood for (``coalesce=True``), archived as such."""
    duration: float = 0.0
    error: str | None = None
    created_at: tuple[dt.datetime, ...] = ()
    """When each handed-over event was created (database clock, UTC)."""
    finished_at: dt.datetime | None = None
    """When the batch was finished (worker clock, UTC)."""
    promise: float = 0.0
    """The promise of the handler's urgency band, in seconds."""
    retry_after: float | None = None
    """Seconds the downstream asked the handler to wait (:class:`outbox.RetryAfter`)."""
    due_in: float | None = None
    """Seconds until the group (or the part of it that goes on) is due again, when it waits."""
    cause: FailureCause | None = None
    """What caused a failed attempt (``retrying`` or ``dead`` after the handler raised)."""

    @property
    def event_ages(self) -> tuple[float, ...]:
        """Seconds from each handed-over event's creation to the end of its batch.

        Computed when asked (by the metrics), not for every batch: a thousand datetime
        subtractions per batch are a cost the plain worker does not need to pay.
        """
        if self.finished_at is None:
            return ()
        end = self.finished_at
        return tuple((end - _utc(created)).total_seconds() for created in self.created_at)

    @property
    def lateness(self) -> float | None:
        """How much later than its band's promise the oldest event was finished (< 0: early)."""
        if self.finished_at is None or not self.created_at:
            return None
        # One batch comes from one database: all naive or all aware, so min() compares them.
        oldest = (self.finished_at - _utc(min(self.created_at))).total_seconds()
        return oldest - self.promise


def _utc(value: dt.datetime) -> dt.datetime:
    # SQLite hands back naive datetimes; outbox writes them in UTC.
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
