"""Place 200 orders, send them through the outbox to a Redis stream, then bill them with the
inbox's ready consumer, after a sink's re-send of one message and an entry without an id:
200 invoices, one repeat acknowledged without effect, one entry refused to the dead stream.

    python -m examples.inbox_consumer.run
"""

from __future__ import annotations

import sys

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from examples.inbox_consumer import app as example
from outbox import schema
from outbox.inbox.redis import RedisStreamConsumer
from outbox.testing import drain

ORDERS = 200


def main(database_url: str | None = None) -> dict[str, int]:
    """Run the example on ``database_url`` (default: the app's, from ``OUTBOX_DATABASE_URL``
    or a SQLite file next to the example); what it did. The stream (``EXAMPLE_STREAM``,
    ``shop-orders`` by default) is emptied first and deleted at the end."""
    app = example.app
    if database_url is not None:
        app.use_database(database_url)
    stream = example.STREAM
    for metadata in (schema.metadata, example.Base.metadata):
        metadata.drop_all(app.engine)
        metadata.create_all(app.engine)
    client = redis.Redis.from_url(example.REDIS_URL)
    client.delete(stream, f"{stream}:dead")
    try:
        with Session(app.engine) as session:
            for n in range(1, ORDERS + 1):
                example.place_order(session, n, f"customer {n % 17}", 100 * n)
            session.commit()
        drain(app)  # the shop's worker: every event appended to the stream

        # A re-send, as the sink makes one after a lost reply: the same fields, the same id.
        _, fields = client.xrange(stream, count=1)[0]
        client.xadd(stream, fields)
        client.xadd(stream, {"payload": "{}"})  # no id: refused, never applied

        consumer = RedisStreamConsumer(
            app,
            example.billing_in,
            example.bill,
            url=example.REDIS_URL,
            stream=stream,
            group="billing",
        )
        with consumer:
            result = consumer.consume(timeout=1)
        with app.engine.connect() as conn:
            invoices = conn.execute(select(func.count()).select_from(example.Invoice)).scalar_one()
        return {
            "orders placed": ORDERS,
            "messages received": result.received,
            "invoices": invoices,
            "repeats acknowledged without effect": result.repeats,
            "refused (no id)": result.refused,
            "dead stream entries": client.xlen(f"{stream}:dead"),
        }
    finally:
        client.delete(stream, f"{stream}:dead")
        client.close()
        app.engine.dispose()


if __name__ == "__main__":
    for what, count in main(sys.argv[1] if len(sys.argv) > 1 else None).items():
        print(f"{what}: {count}")
