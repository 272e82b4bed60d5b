"""How one job runs, whoever runs it (a worker thread, ``outbox.testing.drain``, a forked
process, an executor handed a job's id): ``runner`` runs one leased job to its end and says
what became of it, ``acquisition`` leases due jobs, ``distribute`` enqueues claim jobs,
``claim`` stamps a group on rows, ``batch_job`` hands a group to its handler (``invoke`` calls
it, sync or async) and ``completion`` writes what became of it, fenced by the job's lease."""
