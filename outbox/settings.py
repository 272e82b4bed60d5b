"""Settings shared by every handler of an application (:class:`Settings`), and their
defaults."""

from __future__ import annotations

from dataclasses import dataclass

from outbox._core.checks import is_number
from outbox.exceptions import ConfigurationError
from outbox.inbox import DEFAULT_HORIZON, MAX_HORIZON_SECONDS
from outbox.retry import MIN_RETRY_AFTER_SECONDS

DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_POLL_INTERVAL_SECONDS = 1.0
DEFAULT_RESCUE_INTERVAL_SECONDS = 5.0
DEFAULT_WORKER_STALE_SECONDS = 20.0
DEFAULT_NETWORK_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings shared by every handler of an application. Durations are float seconds.

    ``lease_seconds``: how long a worker holds a job before others may rescue it; workers
    extend the leases of running jobs every third of it. ``poll_interval``: how long an idle
    worker waits before looking for work again. ``rescue_interval``: how often workers look for
    expired leases. ``worker_stale_after``: a worker silent this long is gone: its jobs are
    rescued then, before their leases end, and workers heartbeat every third of it (or of the
    lease, when shorter).
    ``listen``: on PostgreSQL, idle workers LISTEN for new events and wake at once. Workers
    whose connections go through a pooler (PgBouncer), where LISTEN hears nothing, find work by
    polling instead without being told; ``False`` turns listening off everywhere.
    ``min_retry_after``: the shortest a deferral waits (:class:`outbox.RetryAfter`,
    ``batch.retry(after=)``), whatever the downstream said (1 s; at most an hour): a
    ``Retry-After: 0`` must not turn into a hundred calls a second. Tests of an application's
    handlers may lower it to run deferrals at once.
    ``archive_retention_days``: keep the archive's history (every status but ``dead``) this
    many whole UTC days, and have the fleet's leader take older days out (the day under way
    is kept too, so rows stay up to a day longer); ``None`` (the default): the archive is kept
    until ``outbox prune``. Where the archive is partitioned by day (PostgreSQL from
    migration 0009, MariaDB from 0010), a day goes in one statement and its dead letters stay;
    elsewhere its rows are deleted in chunks, as ``outbox prune`` deletes them. Dead letters
    are never taken by retention.
    ``network_timeout``: on the connections of an engine outbox creates (from a URL, not
    ``Outbox(engine=...)``), no wait on the network outlasts about this long when the other end
    stops answering, whether it was sending, waiting for a reply or idle: TCP keepalives and
    ``tcp_user_timeout`` (PostgreSQL), the same socket options (MariaDB through PyMySQL), and a
    connect timeout. A worker cut off from its database by a network that drops packets
    without a reset finds out and retries, rather than wait out the kernel's retransmissions
    (about 15 minutes) or, on an idle connection, for ever. A setting a PostgreSQL URL gives
    itself (``?keepalives_idle=...``) wins; ``None`` leaves the driver's defaults.
    ``ingest_key_horizon``: how long the HTTP API's ingest keeps a producer's idempotency key
    (seconds; seven days by default, as an inbox keeps a message id): a producer that sends a
    key again within it writes nothing twice, one that sends it later writes its event again.
    The fleet's retention pass forgets older keys; ``None``: kept until ``outbox prune``.
    """

    lease_seconds: float = DEFAULT_LEASE_SECONDS
    poll_interval: float = DEFAULT_POLL_INTERVAL_SECONDS
    rescue_interval: float = DEFAULT_RESCUE_INTERVAL_SECONDS
    worker_stale_after: float = DEFAULT_WORKER_STALE_SECONDS
    listen: bool = True
    min_retry_after: float = MIN_RETRY_AFTER_SECONDS
    archive_retention_days: int | None = None
    network_timeout: float | None = DEFAULT_NETWORK_TIMEOUT_SECONDS
    ingest_key_horizon: float | None = DEFAULT_HORIZON.total_seconds()

    def __post_init__(self) -> None:
        for name in ("lease_seconds", "poll_interval", "rescue_interval", "worker_stale_after"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigurationError(f"Settings.{name} must be > 0 seconds, got {value!r}")
        if not (is_number(self.min_retry_after) and 0 <= self.min_retry_after <= 3600):
            raise ConfigurationError(
                "Settings.min_retry_after must be a number of seconds from 0 to 3600, "
                f"got {self.min_retry_after!r}"
            )
        days = self.archive_retention_days
        if days is not None and (
            isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 36500
        ):
            raise ConfigurationError(
                f"Settings.archive_retention_days must be whole days from 1 to 36500, got {days!r}"
            )
        bound = self.network_timeout
        if bound is not None and not (is_number(bound) and 1 <= bound <= 3600):
            raise ConfigurationError(
                f"Settings.network_timeout must be seconds from 1 to 3600, or None, got {bound!r}"
            )
        keys = self.ingest_key_horizon
        if keys is not None and not (is_number(keys) and 0 < keys <= MAX_HORIZON_SECONDS):
            raise ConfigurationError(
                "Settings.ingest_key_horizon must be seconds, more than 0 and at most "
                f"{MAX_HORIZON_SECONDS:.0f} (100 years), or None, got {keys!r}"
            )
