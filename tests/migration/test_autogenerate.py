"""alembic autogenerate in an application's own migrations, with outbox.alembic in its env.py.

Each test builds a throwaway alembic project as an application has one: `alembic init`'s script
template, an env.py with the documented one-liner, a models module holding one buffer model. On
a database where `outbox migrate` has run, autogenerate proposes the buffer table and its
indexes and nothing of outbox's, and the migration it writes runs on every supported database.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import alembic
import pytest
from sqlalchemy import (
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    create_engine,
    insert,
    select,
    text,
)

import outbox.alembic
from outbox import Outbox, db_now, schema
from outbox.ops import notify
from outbox.ops.migrate import upgrade
from tests.migration.conftest import empty_databases

# Every supported database: each generates a migration, and each runs every one generated.
KINDS = ("postgresql", "sqlite", "mariadb")
OUTBOX_TABLES = ("outbox_jobs", "outbox_archive", "outbox_workers", "outbox_alembic_version")
BUFFER = "signup_events"

ALEMBIC_INI = """\
[alembic]
script_location = %(here)s
prepend_sys_path = %(here)s
sqlalchemy.url = {url}
"""

# The env.py of alembic's generic template, online mode, with the documented one-liner.
ENV_PY = """\
from alembic import context
from sqlalchemy import engine_from_config, pool

import outbox.alembic
from models import Base

config = context.config
connectable = engine_from_config(
    config.get_section(config.config_ini_section, {}),
    prefix="sqlalchemy.",
    poolclass=pool.NullPool,
)
with connectable.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        **outbox.alembic.autogenerate_options(),
    )
    with context.begin_transaction():
        context.run_migrations()
"""

MODELS_PY = f"""\
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import BufferMixin


class Base(DeclarativeBase):
    pass


class SignupEvent(BufferMixin, Base):
    __tablename__ = "{BUFFER}"
    address: Mapped[str] = mapped_column(String(200))
"""


def _project(directory: Path, url: str) -> Path:
    """An application's alembic project in ``directory``, on the database at ``url``."""
    (directory / "versions").mkdir(parents=True)
    template = Path(alembic.__file__).parent / "templates" / "generic" / "script.py.mako"
    shutil.copy(template, directory / "script.py.mako")
    (directory / "alembic.ini").write_text(ALEMBIC_INI.format(url=url))
    (directory / "env.py").write_text(ENV_PY)
    (directory / "models.py").write_text(MODELS_PY)
    return directory


def _alembic(project: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run the alembic command in ``project``, as its developer would."""
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(project / "alembic.ini"), *arguments],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _autogenerate(project: Path) -> Path:
    """`alembic revision --autogenerate` in ``project``; the migration it wrote."""
    result = _alembic(project, "revision", "--autogenerate", "-m", "buffers")
    assert 0 == result.returncode, result.stderr
    (migration,) = (project / "versions").glob("*.py")
    return migration


def _upgrade_body(migration: Path) -> str:
    source = migration.read_text()
    return source[source.index("def upgrade()") : source.index("def downgrade()")]


def _write_event(url: str) -> Any:
    """Write one event without a created_at; the created_at the database gave it."""
    engine = create_engine(url)
    try:
        table = Table(BUFFER, MetaData(), autoload_with=engine)
        with engine.begin() as conn:
            conn.execute(insert(table).values(address="ada@example.com"))
            return conn.execute(select(table.c.created_at)).scalar_one()
    finally:
        engine.dispose()


def _migrate_outbox(url: str) -> None:
    engine = create_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def make_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """Factory: a new, empty database of a kind (sqlite, postgresql, mariadb); returns its URL.

    The PostgreSQL and MariaDB databases are created on the test servers for this module alone
    and dropped at its end.
    """
    with empty_databases("outbox_autogen", lambda: tmp_path_factory.mktemp("sqlite")) as make:
        yield make


@pytest.fixture(scope="module")
def generated_on(
    make_database: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """Factory: the migration autogenerate writes on a migrated database of a kind (cached)."""
    migrations: dict[str, Path] = {}

    def generate(kind: str) -> Path:
        if kind not in migrations:
            url = make_database(kind)
            _migrate_outbox(url)
            project = _project(tmp_path_factory.mktemp(f"generated_on_{kind}"), url)
            migrations[kind] = _autogenerate(project)
        return migrations[kind]

    return generate


@pytest.mark.parametrize("kind", KINDS)
def test_autogenerate_proposes_the_buffer_table_and_its_indexes(
    kind: str, generated_on: Callable[[str], Path]
) -> None:
    """The generated upgrade creates the buffer table and its two indexes, and nothing else."""
    operations = re.findall(r"op\.(\w+)\('(\w+)'", _upgrade_body(generated_on(kind)))
    expected = [
        ("create_index", f"ix_{BUFFER}_group_id"),
        ("create_index", f"ix_{BUFFER}_unclaimed"),
        ("create_table", BUFFER),
    ]
    assert expected == sorted(operations)


@pytest.mark.parametrize("kind", KINDS)
def test_autogenerate_mentions_none_of_outbox_tables(
    kind: str, generated_on: Callable[[str], Path]
) -> None:
    """Neither upgrade nor downgrade names outbox_jobs, _archive, _workers or the version table."""
    source = generated_on(kind).read_text()
    assert [] == [table for table in OUTBOX_TABLES if table in source]


@pytest.mark.parametrize("kind", KINDS)
def test_autogenerate_writes_the_clock_portably(
    kind: str, generated_on: Callable[[str], Path]
) -> None:
    """created_at's default is written as outbox.db_now(), imported, not as one dialect's SQL."""
    source = generated_on(kind).read_text()
    defaults = re.findall(r"server_default=([^,]+\)),", source)
    assert (["outbox.db_now()"], True) == (defaults, "\nimport outbox\n" in source)


@pytest.mark.parametrize("target", KINDS)
@pytest.mark.parametrize("source", KINDS)
def test_generated_migration_runs_on_every_database(
    source: str,
    target: str,
    generated_on: Callable[[str], Path],
    make_database: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """A migration generated on one database upgrades another, and its clock fills created_at."""
    url = make_database(target)
    project = _project(tmp_path / "project", url)
    shutil.copy(generated_on(source), project / "versions")
    result = _alembic(project, "upgrade", "head")
    assert 0 == result.returncode, result.stderr
    assert isinstance(_write_event(url), datetime)


@pytest.mark.parametrize("kind", KINDS)
def test_second_autogenerate_proposes_nothing(
    kind: str,
    generated_on: Callable[[str], Path],
    make_database: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """After the generated migration ran, `alembic check` finds nothing to migrate."""
    url = make_database(kind)
    _migrate_outbox(url)
    project = _project(tmp_path / "project", url)
    shutil.copy(generated_on(kind), project / "versions")
    upgraded = _alembic(project, "upgrade", "head")
    assert 0 == upgraded.returncode, upgraded.stderr
    result = _alembic(project, "check")
    assert (0, "No new upgrade operations detected.") == (
        result.returncode,
        result.stdout.strip() or result.stderr.strip().splitlines()[-1],
    )


def _load_models(project: Path) -> Any:
    """The project's models module, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(
        f"models_{uuid.uuid4().hex}", project / "models.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notify_trigger_is_invisible_to_autogenerate(
    generated_on: Callable[[str], Path],
    make_database: Callable[[str], str],
    make_app: Callable[[str], Outbox],
    tmp_path: Path,
) -> None:
    """With `outbox notify install` on the buffer, `alembic check` still finds nothing."""
    url = make_database("postgresql")
    _migrate_outbox(url)
    project = _project(tmp_path / "project", url)
    shutil.copy(generated_on("postgresql"), project / "versions")
    assert 0 == _alembic(project, "upgrade", "head").returncode
    app = make_app(url)
    app.handler(_load_models(project).SignupEvent, name="signups")(lambda batch: None)
    installed = notify.install(app)
    result = _alembic(project, "check")
    assert ([BUFFER], 0) == (installed, result.returncode), result.stderr


# --- the hooks on their own, and with an application's hooks ---------------------------------


def _include(include_object: Any, table: Table, type_: str = "table") -> bool:
    if type_ == "table":
        return bool(include_object(table, table.name, "table", True, None))
    index = Index(f"ix_{table.name}_extra", table.c.id)
    return bool(include_object(index, index.name, "index", True, None))


def _table(name: str) -> Table:
    return Table(name, MetaData(), Column("id", Integer, primary_key=True))


def test_include_object_leaves_out_every_outbox_table() -> None:
    """The filter refuses outbox's three tables and its alembic version table."""
    included = [
        name for name in OUTBOX_TABLES if _include(outbox.alembic.include_object, _table(name))
    ]
    assert [] == included


def test_include_object_leaves_out_what_is_on_outbox_tables() -> None:
    """An index of an outbox table is refused by its table, an application's index is kept."""
    include = outbox.alembic.include_object
    assert (False, True) == (
        _include(include, schema.jobs.to_metadata(MetaData()), "index"),
        _include(include, _table(BUFFER), "index"),
    )


def test_application_include_object_is_asked_about_its_own_objects() -> None:
    """With the application's filter, both must include a table; outbox's are never asked."""
    asked: list[str | None] = []

    def skip_legacy(obj: Any, name: str | None, type_: str, reflected: bool, to: Any) -> bool:
        asked.append(name)
        return name != "legacy_orders"

    include = outbox.alembic.autogenerate_options(include_object=skip_legacy)["include_object"]
    results = {
        name: _include(include, _table(name)) for name in ("outbox_jobs", "legacy_orders", BUFFER)
    }
    expected = (
        {"outbox_jobs": False, "legacy_orders": False, BUFFER: True},
        ["legacy_orders", BUFFER],
    )
    assert expected == (results, asked)


def test_application_render_item_renders_what_outbox_does_not() -> None:
    """With the application's renderer, outbox renders the clock and the application the rest."""

    def render_zero(type_: str, obj: Any, autogen_context: Any) -> str | bool:
        return "my_defaults.zero()" if type_ == "server_default" else False

    render = outbox.alembic.autogenerate_options(render_item=render_zero)["render_item"]
    context = SimpleNamespace(imports=set())
    clock = Column("created_at", DateTime(timezone=True), server_default=db_now())
    zero = Column("attempts", Integer, server_default=text("0"))
    rendered = [render("server_default", c.server_default, context) for c in (clock, zero)]
    assert (["outbox.db_now()", "my_defaults.zero()"], {"import outbox"}) == (
        rendered,
        context.imports,
    )
