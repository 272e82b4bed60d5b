"""The dialect answers questions: outside the database layer, no code compares database names.

The database layer is where SQL and each database's differences live (the ``outbox._db``
package) and the table definitions (``schema``, ``buffer``), whose types name the databases
they vary on. Everywhere else asks ``app.supports`` (:class:`outbox._db.dialects.Supports`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import outbox

DATABASE_LAYER = {"queries.py", "dialects.py", "_db.py", "schema.py", "buffer.py"}
NAMES = {"POSTGRESQL", "SQLITE", "MYSQL"}
DATABASES = {"postgresql", "sqlite", "mysql", "mariadb"}


def _comparisons_of_names(source: str) -> list[str]:
    """The comparisons in ``source`` that involve a database's name: a name constant of
    ``_dialects``, or a string literal naming a database."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            named = (isinstance(operand, ast.Name) and operand.id in NAMES) or (
                isinstance(operand, ast.Attribute) and operand.attr in NAMES
            )
            literal = isinstance(operand, ast.Constant) and operand.value in DATABASES
            if named or literal:
                found.append(ast.unparse(node))
    return found


def test_no_module_outside_the_database_layer_compares_database_names() -> None:
    """Orchestration, services, the command and the integrations ask what a database can do."""
    package = Path(outbox.__file__).parent
    offenders = {
        str(path.relative_to(package)): found
        for path in sorted(package.rglob("*.py"))
        if path.name not in DATABASE_LAYER
        and "_db" not in path.relative_to(package).parts
        and (found := _comparisons_of_names(path.read_text(encoding="utf-8")))
    }
    assert {} == offenders


def test_the_check_finds_a_comparison_of_names() -> None:
    """The check sees both forms: a constant of _dialects and a database's name as text."""
    source = "if app.dialect == POSTGRESQL or url.get_backend_name() != 'sqlite': pass"
    assert 2 == len(_comparisons_of_names(source))


# Dependencies point inwards: cli -> worker -> _engine, _services -> _db. What each layer must
# not import (a module of it, or the package itself).
INWARD = {
    "_db": ("outbox.cli", "outbox.worker", "outbox._engine", "outbox._services", "outbox.app"),
    "_engine": ("outbox.cli", "outbox.worker", "outbox._services"),
    "_services": ("outbox.cli", "outbox.worker", "outbox._engine"),
    "worker.py": ("outbox.cli",),
    "app.py": ("outbox.cli", "outbox.worker", "outbox._engine", "outbox._services"),
    "handler.py": ("outbox.cli", "outbox.worker", "outbox._engine", "outbox._services"),
    # The testing helpers run jobs through the inline executor's drain, which the executors'
    # rule below keeps off the worker too: no worker.
    "testing.py": ("outbox.cli", "outbox.worker"),
    # The operations layer is what the faces call: it asks the engine, the services and the
    # database layer, and knows no face, no process kind that runs work, no executor.
    "ops": (
        "outbox.cli",
        "outbox.web",
        "outbox.worker",
        "outbox.once",
        "outbox.executors",
        "outbox.testing",
        "outbox.prometheus",
    ),
    # The tables are below the database layer: ``_db`` queries them, and ``schema`` declares
    # them (with the clock and the type of their columns, ``db_now`` and ``timestamp``)
    # importing nothing of ``_db``.
    "schema.py": ("outbox._db",),
}
# Who may use the operations layer: the faces, the process kinds and integrations above it.
# Nothing it stands on (the database layer, the engine, the services, the application object
# and the other modules of the user's API) imports it.
BELOW_THE_OPERATIONS_LAYER = (
    "_core",
    "_db",
    "_engine",
    "_services",
    "app.py",
    "handler.py",
    "batch.py",
    "breaker.py",
    "buffer.py",
    "exceptions.py",
    "lifecycle.py",
    "ratelimit.py",
    "results.py",
    "retry.py",
    "schema.py",
    "urgency.py",
)


def _imports(source: str) -> list[str]:
    """Every module ``source`` imports from (``from X import``, ``import X``), and for
    ``from outbox import y``, ``outbox.y`` too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_dependencies_point_inwards() -> None:
    """The database layer imports no engine, service, worker or command; the engine and the
    services no worker or command; the worker no command; the application object no engine;
    the testing helpers no worker."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for layer, forbidden in INWARD.items():
        paths = (
            [package / layer] if layer.endswith(".py") else sorted((package / layer).rglob("*.py"))
        )
        for path in paths:
            bad = [
                name
                for name in _imports(path.read_text(encoding="utf-8"))
                if any(name == f or name.startswith(f + ".") for f in forbidden)
            ]
            if bad:
                offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


def _layer_paths(package: Path, layer: str) -> list[Path]:
    return [package / layer] if layer.endswith(".py") else sorted((package / layer).rglob("*.py"))


def test_nothing_the_operations_layer_stands_on_imports_it() -> None:
    """The database layer, the engine, the services, the application object and the user's API
    import nothing of ``outbox.ops``: the levers sit above what they pull."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for layer in BELOW_THE_OPERATIONS_LAYER:
        for path in _layer_paths(package, layer):
            bad = [
                name
                for name in _imports(path.read_text(encoding="utf-8"))
                if name == "outbox.ops" or name.startswith("outbox.ops.")
            ]
            if bad:
                offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


def test_the_core_imports_nothing_of_outbox() -> None:
    """``outbox._core`` (input checks, durations, the log catalogue, fault points, handler
    kinds, the version) is what every layer may use, so it uses no other part of outbox."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for path in _layer_paths(package, "_core"):
        bad = [
            name
            for name in _imports(path.read_text(encoding="utf-8"))
            if (name == "outbox" or name.startswith("outbox."))
            and not name.startswith("outbox._core")
        ]
        if bad:
            offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


def test_the_top_level_holds_only_the_user_s_api_and_the_flat_integrations() -> None:
    """A module at the package's top level is one a user imports: the user's API (what
    ``outbox.__all__`` names comes from there), the integrations flat by convention, the entry
    points. The levers live in ``outbox.ops``, private helpers in ``outbox._core``."""
    package = Path(outbox.__file__).parent
    top = {path.stem for path in package.glob("*.py")}
    assert TOP_LEVEL == top
    origins = {getattr(outbox, name).__module__.split(".")[1] for name in outbox.__all__}
    assert origins <= top | {"ops", "_core", "_once"}


# One package per database, behind the one interface of ``_db/dialects``: a package builds on
# the base's leaves alone (never on the registry, another database, the queries or the
# engine), and outside the packages only the registry names them, but for PostgreSQL's own
# one-round-trip statements (offered by ``Supports`` and asked for only where it says so).
DATABASE_PACKAGES = ("postgresql", "sqlite", "mysql")
BASE_LEAVES = (
    "outbox._db.dialects.interface",
    "outbox._db.dialects.clock",
    "outbox._db.dialects.network",
    "outbox._db.dialects.payload",
    "outbox._db.dialects.urls",
)
NAMES_THE_PACKAGES = {
    "_db/dialects/registry.py": DATABASE_PACKAGES,
    "_db/queries/one_statement.py": ("postgresql",),
}


def _database_package_imports(path: Path, package: Path) -> list[str]:
    """What a module imports of ``outbox._db`` that its place does not allow."""
    relative = path.relative_to(package)
    own = relative.parts[1] if relative.parts[:1] == ("_db",) and len(relative.parts) > 2 else None
    bad = []
    for name in _imports(path.read_text(encoding="utf-8")):
        if not name.startswith("outbox._db"):
            continue
        named = next(
            (
                db
                for db in DATABASE_PACKAGES
                if name == f"outbox._db.{db}" or name.startswith(f"outbox._db.{db}.")
            ),
            None,
        )
        if own in DATABASE_PACKAGES:
            if named != own and not name.startswith(BASE_LEAVES):
                bad.append(name)
        elif named is not None and named not in NAMES_THE_PACKAGES.get(str(relative), ()):
            bad.append(name)
    return bad


def test_a_database_is_one_package_behind_the_registry() -> None:
    """A database's package imports nothing of ``_db`` but itself and the base's leaves
    (``interface``, ``clock``, ``network``, ``payload``, ``urls``), and no module but the
    registry imports it."""
    package = Path(outbox.__file__).parent
    offenders = {
        str(path.relative_to(package)): sorted(set(bad))
        for path in sorted(package.rglob("*.py"))
        if (bad := _database_package_imports(path, package))
    }
    assert {} == offenders


def test_the_database_check_finds_a_package_named_outside_the_registry(tmp_path: Path) -> None:
    """A query module importing a database's package, and a package importing the registry,
    are both found."""
    (tmp_path / "_db" / "queries").mkdir(parents=True)
    (tmp_path / "_db" / "sqlite").mkdir()
    query = tmp_path / "_db" / "queries" / "jobs.py"
    query.write_text("from outbox._db import sqlite\n", encoding="utf-8")
    statements = tmp_path / "_db" / "sqlite" / "statements.py"
    statements.write_text("from outbox._db.dialects.registry import name_of\n", encoding="utf-8")
    found = [_database_package_imports(path, tmp_path) for path in (query, statements)]
    assert [
        ["outbox._db.sqlite"],
        ["outbox._db.dialects.registry", "outbox._db.dialects.registry.name_of"],
    ] == found


# The one private module a sink may import: the value codec, so that a sink's body writes a
# column's value as the API answers it and ingest reads it (one encoding of bytes, of times...).
SINKS_MAY_IMPORT = ("outbox._core.values",)


def test_sinks_use_the_public_api_only() -> None:
    """A sink imports no private module of outbox (``outbox._db``, ``outbox._engine``...) but
    the value codec, no worker and no command: the sinks depend on outbox's public API."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for path in sorted((package / "sinks").rglob("*.py")):
        bad = [
            name
            for name in _imports(path.read_text(encoding="utf-8"))
            if name.startswith(("outbox._", "outbox.worker", "outbox.cli"))
            and not any(name == m or name.startswith(m + ".") for m in SINKS_MAY_IMPORT)
        ]
        if bad:
            offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


TOP_LEVEL = {
    # the package and its entry point
    "__init__",
    "__main__",
    # the user's API: the application, handlers and their results, events, run-once, worker
    "app",
    "handler",
    "batch",
    "breaker",
    "buffer",
    "fanout",
    "flags",
    "settings",
    "exceptions",
    "lifecycle",
    "once",
    "ratelimit",
    "results",
    "retry",
    "schema",
    "urgency",
    "worker",
    # integrations flat by convention
    "alembic",
    "prometheus",
    "testing",
}

# The faces (the command line, a web face) share one operations layer: the public modules.
FACES = ("cli", "web")
SQL_LAYER = ("outbox._db", "outbox._engine", "outbox._services")


def test_faces_do_not_reach_into_the_sql_layer() -> None:
    """A face imports neither the SQL layer nor the engine nor the services: it asks the
    public modules (``database``, ``distribution``, ``metrics`` ...) the same questions."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for face in FACES:
        for path in sorted((package / face).rglob("*.py")):
            bad = [
                name
                for name in _imports(path.read_text(encoding="utf-8"))
                if any(name == f or name.startswith(f + ".") for f in SQL_LAYER)
            ]
            if bad:
                offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


def test_faces_import_no_private_module_but_the_core() -> None:
    """A face's private imports are its own package's modules and ``outbox._core`` (input
    checks, durations, the log catalogue, the value codec); whatever else it needs is a public
    module or the operations layer's."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for face in FACES:
        for path in sorted((package / face).rglob("*.py")):
            bad = [
                name
                for name in _imports(path.read_text(encoding="utf-8"))
                if name.startswith("outbox._") and not name.startswith("outbox._core")
            ]
            if bad:
                offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


def _module_name(path: Path, package: Path) -> str:
    parts = ("outbox", *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _outbox_imports(source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` imports, wherever it does: for the types only
    (``if TYPE_CHECKING:``) or inside a function, the one module depends on the other all the
    same."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            modules = [name for name in names if name in known]
            found.update(modules or ([node.module] if node.module in known else []))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
    return found


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph`` (module -> modules it imports), each as the modules in it,
    sorted: its strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(cycles)


def _package_graph() -> dict[str, set[str]]:
    package = Path(outbox.__file__).parent
    paths = sorted(package.rglob("*.py"))
    known = {_module_name(path, package) for path in paths}
    # A package's own __init__ imports its modules to re-export them: not an import circle.
    return {
        name: {m for m in _outbox_imports(path.read_text(encoding="utf-8"), known) if m != name}
        for path in paths
        if (name := _module_name(path, package)) != "outbox"
    }


def test_the_application_object_imports_no_engine() -> None:
    """``app`` sits below the engine: what it asks of a handler (async or not, its name, why
    refused) comes from ``_handler_kind``, so ``app`` and ``_engine`` import no circle."""
    graph = _package_graph()
    assert [] == sorted(m for m in graph["outbox.app"] if m.startswith("outbox._engine"))


def test_no_modules_import_each_other_in_a_circle() -> None:
    """No module of outbox imports a module that imports it back, even for the types only."""
    assert [] == _import_cycles(_package_graph())


def test_the_check_finds_an_import_circle() -> None:
    """Two modules importing each other, through a third, are one circle; a chain is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [["a", "b", "c"]] == _import_cycles(graph)


# Executors run jobs through the job runner, as the worker does: beside the worker, not on it.
EXECUTORS_MUST_NOT_IMPORT = ("outbox.worker", "outbox.cli", "outbox.web")
INNER = ("_db", "_engine", "_services", "worker.py", "app.py")


def test_executors_sit_beside_the_worker() -> None:
    """An executor imports no worker, command or web face; no inner layer (the database layer,
    the engine, the services, the worker, the application object) imports an executor."""
    package = Path(outbox.__file__).parent
    offenders = {}
    for path in sorted((package / "executors").rglob("*.py")):
        bad = [
            name
            for name in _imports(path.read_text(encoding="utf-8"))
            if any(name == f or name.startswith(f + ".") for f in EXECUTORS_MUST_NOT_IMPORT)
        ]
        if bad:
            offenders[str(path.relative_to(package))] = sorted(set(bad))
    for layer in INNER:
        paths = (
            [package / layer] if layer.endswith(".py") else sorted((package / layer).rglob("*.py"))
        )
        for path in paths:
            bad = [
                n
                for n in _imports(path.read_text(encoding="utf-8"))
                if n.startswith("outbox.executors")
            ]
            if bad:
                offenders[str(path.relative_to(package))] = sorted(set(bad))
    assert {} == offenders


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module that grows past 600 lines has grown two jobs: it splits by noun."""
    package = Path(outbox.__file__).parent
    long = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert {} == long
