"""A worker's background services, each one ``run_once()`` (what one round does, called by the
worker's maintenance loop and directly by tests) apart from when it runs: ``heartbeat`` (the
worker's row, its leases, the fleet), ``rescuer`` (expired leases, dead workers) and
``listener`` (LISTEN on PostgreSQL, in a thread of its own)."""
