"""Ready-made sinks: handlers that send each group to a bulk HTTP API or a broker, and map what
it answered onto outbox's outcomes.

Each sink is a module behind an extra of its own (``pip install 'sqlalchemy-outbox[nats]'``),
in a sync and an async class; register one as a handler, or call it inside one::

    from outbox.sinks.nats import AsyncJetStreamSink

    orders = AsyncJetStreamSink("nats://127.0.0.1:4222", subject=lambda e: f"orders.{e.region}")
    app.handler(OrderEvent, batch_size=1000, ordering_key="customer_id")(orders)

``outbox.sinks.http`` (httpx), ``outbox.sinks.rabbitmq`` (pika), ``outbox.sinks.nats``
(nats-py) and ``outbox.sinks.redis`` (redis-py). :mod:`outbox.sinks.base` is the seam they
implement, and the mapping of a downstream's answer to retries, discards and failures
(:func:`settle`); what they share besides has a module each: :mod:`~outbox.sinks.encoding`,
:mod:`~outbox.sinks.options`, :mod:`~outbox.sinks.secrets`, :mod:`~outbox.sinks.errors` and
:mod:`~outbox.sinks.dedup_window` (a broker's de-duplication window against the handler's retry
schedule). docs/sinks.md states each sink's guarantee.
"""

from outbox.sinks.base import AsyncSink, BlockingSink, Rejection, Sink, settle

__all__ = ["AsyncSink", "BlockingSink", "Rejection", "Sink", "settle"]
