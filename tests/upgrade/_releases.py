"""Earlier releases of outbox, installed from this repository's history into venvs of their own.

A release is extracted with ``git archive`` and installed with pip into a virtual environment
of its own, as a user installed it: its ``outbox`` command then imports only that release's
code (its environment carries no ``PYTHONPATH``, and its working directory holds only the
application module). The venv is cached under the system's temporary directory, keyed by the
commit and the Python version, and reused by later runs (and by other checkouts of the
repository): the first install takes about 12 s here, a cached one nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The releases the upgrade tier starts from, by name: the commit each was cut from.
#
# 0.1.0 is the code users run before migration 0002: the parent of the commit that added it
# (8f94731, MariaDB's microsecond timestamps). Its pyproject says 0.1.0 and it ships migration
# 0001 only; every migration since is one an upgrade from it runs, under load. The repository has
# no tags: a release cut later gets its name and full commit here.
RELEASES = {"0.1.0": "861cbbfaff2cccabdbaa8f19ecc8203f2e879b63"}
PREVIOUS = "0.1.0"
"""The release users upgrade from."""

# What a user of that release installed beside it: PyMySQL for MariaDB (0.1.0 has no extra for
# it; PostgreSQL's psycopg is a dependency of every release).
RELEASE_EXTRAS = {"0.1.0": ("pymysql",)}
# What `git archive` extracts: the package, its migrations, and what its build needs.
SOURCE_PATHS = ("outbox", "migrations", "pyproject.toml", "README.md")
CACHE_ENV = "OUTBOX_RELEASES_DIR"
INSTALL_TIMEOUT_SECONDS = 600.0
READY = "ready"
# Variables that would let another installation's code into a release's processes.
FOREIGN_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")


class ReleaseUnavailableError(Exception):
    """A release cannot be installed here: no git history, or the commit is missing."""


@dataclass(frozen=True)
class Release:
    """An installed earlier release: its venv and how to run its ``outbox``."""

    name: str
    commit: str
    venv: Path

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"

    @property
    def outbox(self) -> Path:
        """The release's ``outbox`` command."""
        return self.venv / "bin" / "outbox"

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (by default this process's environment) without what would import another
        installation's code, with the venv's ``bin`` first on ``PATH``."""
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if k not in FOREIGN_ENV}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env


def cache_dir() -> Path:
    """Where releases are installed: ``OUTBOX_RELEASES_DIR``, else under the temporary dir."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "outbox-releases"


def install(name: str, *, root: Path = ROOT) -> Release:
    """The release ``name`` installed in its venv, from the cache or installed now.

    Raises :class:`ReleaseUnavailableError` when the repository's history does not have its
    commit (a shallow clone, an exported tree), and ``RuntimeError`` when the install fails.
    """
    commit = RELEASES[name]
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    release = Release(name, commit, cache_dir() / f"{name}-{commit[:12]}-{python}")
    if (release.venv / READY).exists():
        return release
    _require_commit(root, commit)
    release.venv.parent.mkdir(parents=True, exist_ok=True)
    with _locked(release.venv.with_name(release.venv.name + ".lock")):
        if not (release.venv / READY).exists():  # another run may have installed it meanwhile
            _build(release, root)
    return release


def _require_commit(root: Path, commit: str) -> None:
    try:
        found = subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError as error:
        raise ReleaseUnavailableError(f"git is not installed: {error}") from None
    if found.returncode != 0:
        raise ReleaseUnavailableError(
            f"commit {commit} is not in the history of {root} (a shallow clone? "
            "`git fetch --unshallow` brings it)"
        )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``: one install at a time, across processes."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(release: Release, root: Path) -> None:
    """Extract the release's source and install it into a fresh venv (a venv cannot be moved,
    so it is built in place and marked ready last)."""
    shutil.rmtree(release.venv, ignore_errors=True)
    release.venv.mkdir()
    source = release.venv / "src"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", release.commit, *SOURCE_PATHS],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    _run([sys.executable, "-m", "venv", str(release.venv)], root)
    extras = RELEASE_EXTRAS.get(release.name, ())
    _run(
        [str(release.python), "-m", "pip", "install", "--quiet", str(source), *extras],
        root,
        env=release.environment(),
    )
    # The release must import its own code, from its venv, nothing else.
    found = subprocess.run(
        [str(release.python), "-c", "import outbox; print(outbox.__file__)"],
        capture_output=True,
        text=True,
        cwd=release.venv,
        env=release.environment(),
        check=True,
    ).stdout.strip()
    if not Path(found).is_relative_to(release.venv / "lib"):
        raise RuntimeError(f"release {release.name} imports outbox from {found}, not its venv")
    shutil.rmtree(source)
    (release.venv / READY).write_text(f"{release.name} {release.commit}\n")


def _run(command: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> None:
    done = subprocess.run(
        command,
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
