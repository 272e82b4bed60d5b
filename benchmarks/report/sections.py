"""The report's sections: their order and titles."""

from __future__ import annotations

# Sections in this order; any other benchmark follows, by name.
ORDER = (
    "drain_throughput",
    "drain_mariadb",
    "drain_rate_limited",
    "handler_outcomes",
    "peers",
    "enqueue_cost",
    "idle_buffers",
    "scale",
    "claim_contention",
    "claim_floor",
    "statement_account",
    "gc_settle",
    "memory_bloat",
    "wakeup_latency",
    "autovacuum",
    "sink_rabbitmq",
    "sink_nats",
    "sink_redis",
    "console_big_tables",
    "ingest_http",
    "scaling_read",
    "autoscaling",
    "startup",
)


TITLES = {
    "drain_throughput": "Drain throughput",
    "drain_mariadb": "Drain throughput on MariaDB",
    "drain_rate_limited": "Draining through a rate-limited API",
    "handler_outcomes": "Handler outcomes: deferrals and bisection",
    "peers": "Against the peers",
    "enqueue_cost": "Cost of enqueue",
    "idle_buffers": "Idle buffers: distribution with 1,000 buffers, 10 of them busy",
    "scale": "Scale",
    "claim_contention": "Claim contention",
    "claim_floor": "What a claim of 1,000 rows costs PostgreSQL",
    "statement_account": "Statements per group",
    "gc_settle": "The garbage collector in a worker",
    "memory_bloat": "Memory and bloat",
    "wakeup_latency": "Wake-up latency",
    "autovacuum": "Autovacuum",
    "sink_rabbitmq": "RabbitMQ sink",
    "sink_nats": "NATS JetStream sink",
    "sink_redis": "Redis Streams sink",
    "console_big_tables": "The operators' console on big tables",
    "ingest_http": "Ingest over HTTP",
    "scaling_read": "The desired-workers read",
    "autoscaling": "Autoscaling",
    "startup": "Start-up of `outbox work`: launch to first claim",
    "migrations": "outbox migrate with 1,000,000 archive rows, per revision, up and down",
}
