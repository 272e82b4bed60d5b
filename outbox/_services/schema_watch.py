"""The schema watch: a running worker looks, once per heartbeat, whether the database's schema
is still one it may work on (one row of ``outbox_schema``, by its key).

A migration that needs newer workers, or a downgrade below the generation the worker
understands, makes :meth:`SchemaWatch.run_once` return why; the worker then stops taking work
(:mod:`outbox._db.generation`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from outbox._core import log as _log
from outbox._db import generation, queries, run_in_transaction
from outbox._db.dialects import is_missing_table
from outbox.app import Outbox
from outbox.exceptions import SchemaIncompatibleError


@dataclass
class SchemaWatch:
    """Reads the database's schema generation for one worker."""

    app: Outbox

    def run_once(self) -> SchemaIncompatibleError | None:
        """Why this worker may no longer work on the database's schema; None while it may."""
        try:
            state = run_in_transaction(self.app.engine, queries.schema_generation)
        except DBAPIError as error:
            if not is_missing_table(error):
                raise
            # It was there when the worker started: the tables were downgraded under it.
            return generation.incompatibility(None, table_missing=True)
        return generation.incompatibility(state)

    def watch(
        self, worker_id: str, database_error: Callable[[DBAPIError], None], log: _log.Logger
    ) -> SchemaIncompatibleError | None:
        """:meth:`run_once`, and when the schema is one the worker ``worker_id`` may not work
        on, say why in one line on ``log``, the caller's logger
        (``outbox.worker.schema_incompatible``): the caller stops looking then, so it is said
        once. A database error is handed to ``database_error`` and answers None: the next look
        decides."""
        try:
            problem = self.run_once()
        except DBAPIError as error:
            database_error(error)
            return None
        if problem is not None:
            log.error(
                _log.WORKER_SCHEMA_INCOMPATIBLE,
                worker=worker_id,
                schema_generation=problem.generation,
                workers_from=problem.workers_from,
                worker_generation=problem.worker_generation,
                reason=str(problem),
            )
        return problem
