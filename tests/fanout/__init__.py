"""The fan-out proven through the real `outbox work`: four consumers of one buffer, three of them
in trouble, workers killed at random."""
