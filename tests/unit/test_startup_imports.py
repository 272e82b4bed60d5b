"""What ``import outbox`` and ``outbox work`` import before the first claim: not the code of
commands, extras and tools a worker never uses (benchmarks/startup.py measures what they cost).

Each check runs in a fresh interpreter and reads its ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from outbox.cli._main import COMMAND_MODULES, main, register_all
from outbox.ops.migrate import known_revisions
from outbox.ops.revisions import shipped_revisions
from tests.conftest import reset_schema

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.cli_app:app"
# Never needed to run handlers: the console and its stack, the metrics extra, the sinks'
# clients, the migrations' tooling, and the commands of other topics.
EXTRAS = {
    "alembic",
    "httpx",
    "jinja2",
    "mako",
    "msgspec",
    "outbox.alembic",
    "outbox.ops.migrate",
    "outbox.prometheus",
    "outbox.sinks",
    "outbox.web",
    "prometheus_client",
    "starlette",
}
OTHER_COMMANDS = {
    f"outbox.cli.commands.{module}" for module in set(COMMAND_MODULES.values()) - {"work"}
}


def modules_after(code: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter has imported once ``code`` has run (or exited)."""
    listing = tmp_path / "modules.txt"
    script = textwrap.dedent(f"""
        import atexit, sys
        atexit.register(lambda: open({str(listing)!r}, "w").write("\\n".join(sys.modules)))
    """) + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert listing.exists(), done.stderr
    return set(listing.read_text().split())


def test_import_outbox_imports_no_extra(tmp_path: Path) -> None:
    loaded = modules_after("import outbox", tmp_path)
    assert set() == loaded & (EXTRAS | OTHER_COMMANDS | {"outbox.cli"})


def test_outbox_work_imports_neither_extras_nor_other_commands(tmp_path: Path) -> None:
    """Up to its exit, a burst worker has imported neither alembic (the revision check reads
    the scripts' text) nor the modules of the other commands."""
    url = f"sqlite:///{tmp_path}/outbox.sqlite3"
    reset_schema(url)
    loaded = modules_after(
        f"""
        import sys
        sys.argv = ["outbox", "--app", {APP!r}, "--database-url", {url!r}, "work", "--burst"]
        from outbox.cli import main
        main()
        """,
        tmp_path,
    )
    assert "outbox.worker" in loaded  # it did start a worker
    assert set() == loaded & (EXTRAS | OTHER_COMMANDS)


def test_each_command_is_registered_by_the_module_named_for_it(tmp_path: Path) -> None:
    """Importing the module ``COMMAND_MODULES`` names registers the command, in a fresh
    command group each time; and every command registered is named there."""
    code = """
        import importlib, sys
        from outbox.cli._main import COMMAND_MODULES
        for name, module in sorted(COMMAND_MODULES.items()):
            for loaded in [m for m in sys.modules if m.startswith("outbox.cli")]:
                del sys.modules[loaded]
            main = importlib.import_module("outbox.cli._main").main
            importlib.import_module(f"outbox.cli.commands.{module}")
            if name not in main.commands:
                print(name, module)
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ("", "") == (done.stdout, done.stderr)
    register_all()
    assert sorted(COMMAND_MODULES) == sorted(main.commands)


def test_the_scripts_text_names_the_revisions_alembic_reads() -> None:
    assert known_revisions() == shipped_revisions()
