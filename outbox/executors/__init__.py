"""Executors: outbox's claim and batch jobs run on a task system the application already runs,
rather than in ``outbox work`` processes.

The job table stays the source of truth under every executor: a message names a job, and the
job runner (:mod:`outbox._engine.runner`) leases it, runs it and writes its outcome, fenced by
its lease, exactly as a worker would. Each executor is a module of its own:

- :mod:`outbox.executors.celery`: on the application's own Celery, an extra
  (``pip install 'sqlalchemy-outbox[celery]'``);
- :mod:`outbox.executors.inline`: in a test's own process, as the writing transaction commits
  (no extra; users reach it as :func:`outbox.testing.inline`).
"""
