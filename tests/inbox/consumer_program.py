"""A consumer in a process of its own, for the tests that kill one between its commit and
its acknowledgement:

    python -m tests.inbox.consumer_program rabbitmq|redis|nats DATABASE_URL SOURCE

It consumes one message into the effects table (with ``OUTBOX_TEST_RUN`` set, the RabbitMQ
consumer runs until SIGTERM instead). With ``OUTBOX_TEST_DIE_AFTER_COMMIT`` set to a
path, it writes that file once the batch's transaction committed, then waits to be killed:
the test decides where it dies, the library knows nothing of it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from outbox import Outbox
from tests.inbox._support import INBOX, AsyncRecorder, Recorder


def _die_after_commit(marker: Path) -> None:
    def after_commit(session: Any) -> None:
        marker.write_text("committed", encoding="utf-8")
        while True:  # the test kills the process here, before any ack
            time.sleep(1)

    event.listen(Session, "after_commit", after_commit)


def main(broker: str, database_url: str, source: str) -> None:
    marker = os.environ.get("OUTBOX_TEST_DIE_AFTER_COMMIT")
    if marker:
        _die_after_commit(Path(marker))
    app = Outbox(database_url)
    inbox = app.inbox(INBOX)
    if broker == "rabbitmq":
        from outbox.inbox.rabbitmq import RabbitMQConsumer
        from tests.inbox.test_rabbitmq import RABBITMQ_URL

        consumer = RabbitMQConsumer(app, inbox, Recorder(), queue=source, url=RABBITMQ_URL)
        if os.environ.get("OUTBOX_TEST_RUN"):
            # The long-running loop, until SIGTERM: its counts on stdout.
            print(consumer.run(), flush=True)
        else:
            with consumer:
                consumer.consume(max_messages=1, timeout=30)
    elif broker == "redis":
        from outbox.inbox.redis import RedisStreamConsumer
        from tests.inbox.test_redis import REDIS_URL, consumer_options

        with RedisStreamConsumer(
            app, inbox, Recorder(), url=REDIS_URL, **consumer_options(source, "doomed")
        ) as consumer:
            consumer.consume(max_messages=1, timeout=30)
    else:
        from tests.inbox.test_nats import consume_once

        asyncio.run(consume_once(database_url, source, AsyncRecorder()))


if __name__ == "__main__":
    main(*sys.argv[1:4])
