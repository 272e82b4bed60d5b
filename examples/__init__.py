"""Runnable example projects; ``tests/examples`` runs each one so they cannot rot."""
