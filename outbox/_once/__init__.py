"""The parts of the run-once calls (:mod:`outbox.once`, the public module): the results they
return, and the caller that registers, heartbeats and runs jobs while one works."""
