"""Executors: outbox's claim and batch jobs run on a task system the application already runs,
rather than in ``outbox work`` processes.

The job table stays the source of truth under every executor: a message names a job, and the
job runner (:mod:`outbox._engine.runner`) leases it, runs it and writes its outcome, fenced by
its lease, exactly as a worker would. Each executor is an extra of its own:

- :mod:`outbox.executors.celery` (``pip install 'sqlalchemy-outbox[celery]'``).
"""
