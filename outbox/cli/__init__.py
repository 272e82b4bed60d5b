"""The ``outbox`` command: the only place that configures logging and handles signals.

Exit codes: 0 ok; 1 runtime failure (including tables not migrated, a handler's buffer table
missing, and a worker that had to abandon in-flight work); 2 usage error (bad ``--app``,
unknown handler, bad option); 3 database unreachable or unusable.

A package: ``_main`` holds the command group and the options every command shares; each module
of ``commands`` registers the commands of one topic, imported when one of its commands is asked
for (``outbox work`` imports neither the archive's nor the console's code); ``_signals`` is the
one module that handles signals (a worker's two-stage stop, the supervisor of ``--processes``).
"""

from __future__ import annotations

from outbox.cli._context import GC_THRESHOLD, Context, load_app, settle_heap
from outbox.cli._logging import configure_logging
from outbox.cli._main import main

__all__ = ["GC_THRESHOLD", "Context", "configure_logging", "load_app", "main", "settle_heap"]
