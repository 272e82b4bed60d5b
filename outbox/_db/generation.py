"""Schema generations: what the database asks of its workers, and what a worker understands.

Each migration from 0005 on declares the schema ``generation`` it brings (its number) and
``workers_from``, the oldest worker generation that works correctly on it; each run of
``outbox migrate`` records both in ``outbox_schema`` (:func:`record_migration`), up or down. A
worker records the generation it understands (:data:`GENERATION`) in its heartbeat row, and
stops when the database asks for a newer one, or was downgraded below its own: it cannot read a
revision script it does not ship, so the database says what it needs in data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from outbox import schema
from outbox._core.version import VERSION
from outbox._db import queries
from outbox._db.dialects import is_missing_table
from outbox.exceptions import SchemaIncompatibleError, SchemaMissingError

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext, MigrationInfo

GENERATION = schema.GENERATION
"""The schema generation this outbox's workers understand: its newest migration's number."""
RECORDED_SINCE = 5
"""The generation that brought ``outbox_schema``: a database without it is older."""


def incompatibility(
    state: queries.SchemaGeneration | None,
    *,
    table_missing: bool = False,
    generation: int = GENERATION,
    version: str = VERSION,
) -> SchemaIncompatibleError | None:
    """Why a worker of ``generation`` (outbox ``version``) may not work on a database whose
    schema is ``state``; None when it may.

    ``table_missing``: ``outbox_schema`` is gone, the tables were downgraded below the
    generation that brought it. A table without its row asks nothing.
    """
    this = f"this worker (outbox {version}) understands generation {generation}"
    if table_missing:
        return SchemaIncompatibleError(
            f"the database's outbox schema records no generation (outbox_schema is gone): it "
            f"was downgraded below generation {RECORDED_SINCE} and {this}; run workers of "
            "the outbox version the tables belong to, or `outbox migrate` to upgrade them",
            generation=None,
            workers_from=None,
            worker_generation=generation,
        )
    if state is None:
        return None
    if state.workers_from > generation:
        by = f" (migrated by outbox {state.migrated_by})" if state.migrated_by else ""
        return SchemaIncompatibleError(
            f"the database's outbox schema is at generation {state.generation}{by} and needs "
            f"workers of generation {state.workers_from} or newer; {this}: upgrade it",
            generation=state.generation,
            workers_from=state.workers_from,
            worker_generation=generation,
        )
    if state.generation < generation:
        return SchemaIncompatibleError(
            f"the database's outbox schema is at generation {state.generation} and outbox "
            f"{version} needs generation {generation}: run `outbox migrate` to upgrade it, or "
            "run the outbox version it belongs to",
            generation=state.generation,
            workers_from=state.workers_from,
            worker_generation=generation,
        )
    return None


def _recorded(engine: Engine) -> queries.SchemaGeneration | None:
    """``outbox_schema``'s row (None: the table has none); SchemaMissingError when the table
    is not there."""
    try:
        with engine.connect() as conn:
            return queries.schema_generation(conn)
    except DBAPIError as error:
        if is_missing_table(error):
            raise SchemaMissingError([schema.schema_state.name]) from error
        raise


def check(engine: Engine) -> None:
    """Refuse to start a worker on a schema it may not work on: SchemaIncompatibleError in one
    line; SchemaMissingError when ``outbox_schema`` is not there (not migrated yet)."""
    problem = incompatibility(_recorded(engine))
    if problem is not None:
        raise problem


def recorded_incompatibility(engine: Engine) -> SchemaIncompatibleError | None:
    """Why this outbox may not work on the database's schema, as ``outbox_schema`` records it;
    None when it may, or when there is no ``outbox_schema`` to say.

    Asked when some of the framework's tables are missing: tables an older outbox migrated, or
    taken back by ``outbox migrate --to``, lack the newer ones, and the generation they are at
    says more than the list of tables missing.
    """
    try:
        state = _recorded(engine)
    except SchemaMissingError:
        return None
    return incompatibility(state)


def record_migration(
    ctx: MigrationContext, step: MigrationInfo, heads: set[str], run_args: dict[str, Any]
) -> None:
    """alembic's ``on_version_apply`` hook: after each step, up or down, record the generation
    of the revision the step ends at, in the step's transaction.

    A revision before 0005 declares none, and has no ``outbox_schema`` to record it in.
    """
    for revision_id in step.destination_revision_ids:
        script = step.revision_map.get_revision(revision_id)
        module = getattr(script, "module", None)
        generation = getattr(module, "generation", None)
        workers_from = getattr(module, "workers_from", None)
        if generation is None or workers_from is None or ctx.connection is None:
            continue
        queries.record_schema_generation(ctx.connection, generation, workers_from)
