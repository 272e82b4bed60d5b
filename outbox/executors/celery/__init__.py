"""outbox on the application's own Celery: claim and batch jobs as Celery tasks.

One call, :func:`install`, puts outbox on a Celery application (the application, its broker
and its result backend stay the user's)::

    from celery import Celery
    from outbox.executors.celery import install

    celery = Celery("shop", broker="amqp://guest:guest@localhost//")
    executor = install(celery, outbox_app)

and two commands run it, beside the application's own workers::

    celery -A shop.tasks worker --queues outbox --concurrency 4
    celery -A shop.tasks beat

It registers three tasks, whose messages all go to a queue of their own (``queue``, named in
each message's options, so the application's ``task_routes`` and long tasks never hold them
up):

``outbox.distribute``
    On the beat schedule ``BEAT_SENDS_PER_TICK`` times every ``distribute_every`` seconds: the
    claim jobs the handlers' unclaimed events need (:func:`outbox.once.distribute_once` on the
    tick the beat sent the message in, stamped in its ``SENT_AT_HEADER``), then a message for
    each new claim job. The tick is taken in the database, per handler: of any number of
    messages naming one tick (from any number of beats), one distributes, and the others find
    the tick taken and do nothing. A message that waits in the queue past its tick's end still
    takes its own tick.
``outbox.run_job``
    Runs one job, named by its id in the message, through the job runner that ``outbox work``
    runs it with: a claim job claims full batches and hands each to its handler at once, for
    up to a second, exactly as under ``outbox work``; a batch job hands its group to its
    handler. Pauses, rate limits, fleet-wide caps, circuit breakers and ordering live in the
    database and hold across Celery workers and ``outbox work`` processes alike.
``outbox.rescue``
    On the beat schedule every ``rescue_every`` seconds: frees the jobs of gone workers and of
    expired leases, then publishes a message for each job it freed and for any due job that no
    message has taken for ``OVERDUE_AFTER_SECONDS`` (a message lost with a broker, or never
    published), at most ``SWEEP_LIMIT`` a run. In a process not yet allowed to judge another
    worker gone (a child started just now), it frees expired leases only and sends itself on
    for another process (at most ``RESCUE_HOPS`` times).

The job table stays the source of truth. A message names a job; the task leases that job only
when it is due and unleased, so a message delivered twice (a visibility timeout, ``acks_late``,
a lost worker, a duplicate publish) finds it leased or gone and does nothing (logged at debug,
``outbox.executor.skipped``). Nothing depends on ``acks_late`` or
``task_reject_on_worker_lost``: a killed worker loses only its lease.

Each worker process (each prefork child) registers in ``outbox_workers`` and heartbeats, so
``outbox status`` and the console show it like any worker, its running job's lease is
extended, and a killed child's jobs are freed once its heartbeat goes silent, not at lease end.
Engines are made per child: the pool a child inherits from the parent is disposed of
(``engine.dispose(close=False)``) when it starts. A child stopped with SIGTERM (Celery's cold
shutdown, the end of a ``worker_soft_shutdown_timeout``) gives back the leases it holds, and
their work is taken again at once. ``outbox workers drain`` or ``stop`` of one of them, read at
its heartbeat, shuts its Celery worker down warm.
"""

from outbox.executors.celery.executor import GIVE_BACK_SECONDS as GIVE_BACK_SECONDS
from outbox.executors.celery.executor import RECENT_TICKS as RECENT_TICKS
from outbox.executors.celery.executor import RESCUE_HOPS as RESCUE_HOPS
from outbox.executors.celery.executor import CeleryExecutor, install
from outbox.executors.celery.messages import (
    BEAT_ENTRIES,
    BEAT_SENDS_PER_TICK,
    DEFAULT_DISTRIBUTE_EVERY_SECONDS,
    DEFAULT_QUEUE,
    DISTRIBUTE_TASK,
    MAX_COUNTDOWN_SECONDS,
    OVERDUE_AFTER_SECONDS,
    RESCUE_TASK,
    RUN_JOB_TASK,
    SENT_AT_HEADER,
    SWEEP_LIMIT,
)
from outbox.executors.celery.messages import DUE_MARGIN_SECONDS as DUE_MARGIN_SECONDS
from outbox.executors.celery.messages import MESSAGE_EXPIRY_PERIODS as MESSAGE_EXPIRY_PERIODS
from outbox.executors.celery.process import STOP_JOIN_SECONDS as STOP_JOIN_SECONDS

__all__ = [
    "BEAT_ENTRIES",
    "BEAT_SENDS_PER_TICK",
    "DEFAULT_DISTRIBUTE_EVERY_SECONDS",
    "DEFAULT_QUEUE",
    "DISTRIBUTE_TASK",
    "MAX_COUNTDOWN_SECONDS",
    "OVERDUE_AFTER_SECONDS",
    "RESCUE_TASK",
    "RUN_JOB_TASK",
    "SENT_AT_HEADER",
    "SWEEP_LIMIT",
    "CeleryExecutor",
    "install",
]
