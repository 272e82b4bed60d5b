"""The targets set for the benchmarks, in one place, so that the tables and the summary agree."""

from __future__ import annotations

# The targets set for the benchmarks, in one place so that the tables and the summary agree.
DRAIN_RATIO = 0.8  # outbox / raw loop, with 1 and 2 processes


DRAIN_TARGET_BATCH = 1000  # the batch size the drain target was set at


PGQUEUER_RATIO = 5.0  # outbox / pgqueuer's best configuration


PROCRASTINATE_RATIO = 100.0  # outbox / procrastinate's best configuration


PEERS_JOBS = 200_000  # the peers are judged with as many jobs as the drain has events


ADD_EVENTS_RATIO = 0.85  # add_events / Core executemany


SCALE_ROWS = 1_000_000  # the backlog at which the count and the claim are judged


SCALE_BASE_ROWS = 10_000  # the backlog the claim's growth is measured from


SCALE_MS = 5.0  # the count and the claim, each, below this at SCALE_ROWS


CLAIM_GROWTH = 1.5  # claim time at SCALE_ROWS over claim time at SCALE_BASE_ROWS, below this


WORKER_RSS_MB = 100.0  # a worker's peak resident set, decimal megabytes


VACUUMED_OVER_EMPTY = 2.0  # buffer size after drain + VACUUM (+ REINDEX) over the empty buffer


LATENCY_RATE = 1000.0  # events/s: the rate the latency target is measured at


LATENCY_MODES = ("notify", "polling")  # with LISTEN/NOTIFY, and with polling only


RATE_LIMITED_RATIO = 0.9  # a rate-limited drain: theoretical minimum / measured seconds


SINK_RATIO = 0.8  # a sink / a raw client loop publishing the same messages, same acknowledgements


SINK_STATEMENTS = 0.05  # database statements per published message, drained at SINK_BATCH


SINK_BATCH = 1000  # the batch size the statements target is set at


SINK_DRAIN_RATE = 10_000.0  # events/s drained from PostgreSQL into a broker by one worker


CONSOLE_P95_MS = (
    300.0  # every console page and endpoint, 10,000,000 buffer rows, 1,000,000 archived
)


CONSOLE_READS_PER_PERIOD = 1.0  # status reads per refresh period, whatever the viewers


INGEST_EVENTS_PER_SECOND = 5000.0  # through the batch endpoint into PostgreSQL, one process


SCALING_READ_MS = 5.0  # the desired-workers read from Python, 10,000,000 events waiting


OUTAGE_P95_RATIO = 1.10  # oldest-age p95 of a database beside one that went away, over without
