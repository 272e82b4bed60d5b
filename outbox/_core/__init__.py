"""What every layer of outbox may use, and which uses nothing of outbox: checks of input, durations,
the log's event catalogue, fault points for the fault tests, what kind a handler is, the version,
and the one codec of values between JSON and columns (``values``)."""
