"""``python -m examples.celery_orders init | place N | received``: the example's tables and
queue, N orders placed through the shop's ``orders.place`` task (a worker of the ``shop``
queue writes them), and what RabbitMQ received."""

from __future__ import annotations

import json
import os
import sys

from examples.celery_orders import tasks
from examples.celery_orders.shop import init, received

USAGE = "usage: python -m examples.celery_orders init | place N | received"


def main(argv: list[str]) -> int:
    """Run one chore; 2 with the usage for anything else."""
    database_url = os.environ.get(tasks.DATABASE_URL_ENV, tasks.DEFAULT_DATABASE_URL)
    if argv[:1] == ["init"]:
        init(database_url, tasks.rabbitmq_url, tasks.placed_queue)
    elif argv[:1] == ["place"] and len(argv) == 2:
        for n in range(int(argv[1])):
            tasks.place.delay(f"customer-{n % 7}", 100 + n)
        print(argv[1], "orders sent to orders.place")
    elif argv[:1] == ["received"]:
        print(json.dumps(received(tasks.rabbitmq_url, tasks.placed_queue), indent=2))
    else:
        print(USAGE, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
