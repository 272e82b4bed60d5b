"""A Celery application with a task that runs the shop's outbox, as a Celery shop would.

Celery's own logging as it comes (the worker configures the root logger), with the logger's
name added to its line format, a one-line setting, so that a line says which library wrote it.
"""

from __future__ import annotations

import logging
import os

from celery import Celery

from tests.hosts import shop

BROKER_URL_ENV = "SHOP_BROKER_URL"
QUEUE_ENV = "SHOP_QUEUE"
OUTBOX_LEVEL_ENV = "SHOP_OUTBOX_LEVEL"  # e.g. DEBUG: outbox's debug, and nobody else's
LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s"

celery = Celery("shop", broker=os.environ.get(BROKER_URL_ENV, "redis://127.0.0.1:6379/0"))
celery.conf.update(
    result_backend=celery.conf.broker_url,
    task_default_queue=os.environ.get(QUEUE_ENV, "shop"),
    worker_log_format=LOG_FORMAT,
)

if OUTBOX_LEVEL_ENV in os.environ:
    logging.getLogger("outbox").setLevel(os.environ[OUTBOX_LEVEL_ENV])


@celery.task
def run_outbox() -> dict[str, int]:
    """Handle the shop's events that are due now."""
    return shop.run_burst()
