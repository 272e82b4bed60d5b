"""alembic autogenerate in the application's own migrations.

An application's ``env.py`` passes these options to ``context.configure``::

    import outbox.alembic

    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        **outbox.alembic.autogenerate_options(),
    )

They do two things. ``include_object`` keeps outbox's own tables (``outbox_jobs``,
``outbox_archive`` and its partitions, ``outbox_workers`` and the version table
``outbox_alembic_version``) out of
the application's migrations: ``outbox migrate`` owns them, and without the filter autogenerate
proposes dropping them. ``render_item`` writes a buffer's ``created_at`` default as
``outbox.db_now()``, which compiles to each database's clock when the migration runs, instead of
the text of the one database the migration was generated against
(``sa.text('statement_timestamp()')`` fails on SQLite and MariaDB).

An ``env.py`` with filters or renderers of its own hands them over, and outbox combines them::

    **outbox.alembic.autogenerate_options(include_object=my_filter, render_item=my_renderer)

The module is named after the tool it serves; import it as ``import outbox.alembic`` (not
``from outbox import alembic``, which would give the name ``alembic`` in ``env.py`` to this
module rather than to alembic).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict

from sqlalchemy.schema import DefaultClause, SchemaItem

from outbox import schema
from outbox.ops.migrate import VERSION_TABLE
from outbox.schema import db_now

if TYPE_CHECKING:
    from alembic.autogenerate.api import AutogenContext
    from alembic.runtime.environment import IncludeObjectFn, NameFilterType, RenderItemFn

OWN_TABLES = frozenset({*schema.TABLE_NAMES, VERSION_TABLE})
"""The tables ``outbox migrate`` creates and versions; never the application's migrations'."""
OWN_TABLE_PREFIX = "outbox_archive_"
"""The archive's partitions (PostgreSQL: ``outbox_archive_before``, ``outbox_archive_default``,
``outbox_archive_dYYYYMMDD`` and its leaves), made by outbox's migrations and its retention: a
database reflects them as tables of their own, and they are outbox's too."""

# What a migration writes for the buffer clock, and the import that makes the name resolve.
_CLOCK_IMPORT = "import outbox"
_CLOCK_EXPRESSION = "outbox.db_now()"


class AutogenerateOptions(TypedDict):
    """The keyword arguments :func:`autogenerate_options` gives ``context.configure``."""

    include_object: IncludeObjectFn
    render_item: RenderItemFn


def include_object(
    object_: SchemaItem,
    name: str | None,
    type_: NameFilterType,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """alembic's ``include_object`` hook: False for outbox's tables and everything on them.

    Indexes, columns and constraints are judged by the table they belong to.
    """
    if type_ == "table":
        return not _own(name)
    table = getattr(object_, "table", None)
    return not _own(getattr(table, "name", None))


def _own(name: str | None) -> bool:
    return name is not None and (name in OWN_TABLES or name.startswith(OWN_TABLE_PREFIX))


def render_item(type_: str, object_: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """alembic's ``render_item`` hook: the buffer clock as ``outbox.db_now()``; False otherwise.

    False tells alembic to render the item its own way.
    """
    if (
        type_ == "server_default"
        and isinstance(object_, DefaultClause)
        and isinstance(object_.arg, db_now)
    ):
        autogen_context.imports.add(_CLOCK_IMPORT)
        return _CLOCK_EXPRESSION
    return False


def autogenerate_options(
    *,
    include_object: IncludeObjectFn | None = None,
    render_item: RenderItemFn | None = None,
) -> AutogenerateOptions:
    """``include_object`` and ``render_item`` for ``context.configure(**...)`` in ``env.py``.

    An application's own ``include_object`` is asked only about objects that are not
    outbox's (both must include an object); its own ``render_item`` renders every item outbox
    does not (outbox renders only the buffer clock).
    """
    return {
        "include_object": _both(include_object) if include_object else _outbox_include_object,
        "render_item": _either(render_item) if render_item else _outbox_render_item,
    }


# autogenerate_options' parameters take the hooks' names, alembic's words for them.
_outbox_include_object = include_object
_outbox_render_item = render_item


def _both(theirs: IncludeObjectFn) -> IncludeObjectFn:
    def include(
        object_: SchemaItem,
        name: str | None,
        type_: NameFilterType,
        reflected: bool,
        compare_to: SchemaItem | None,
    ) -> bool:
        return _outbox_include_object(object_, name, type_, reflected, compare_to) and theirs(
            object_, name, type_, reflected, compare_to
        )

    return include


def _either(theirs: RenderItemFn) -> RenderItemFn:
    def render(type_: str, object_: Any, autogen_context: AutogenContext) -> str | Literal[False]:
        rendered = _outbox_render_item(type_, object_, autogen_context)
        return rendered if rendered is not False else theirs(type_, object_, autogen_context)

    return render
