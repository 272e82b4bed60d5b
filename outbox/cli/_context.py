"""What every command starts from: the application (``--app``), its database URL, the heap
settled once it is loaded."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from types import ModuleType

import click
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from outbox.app import DATABASE_URL_ENV, Outbox
from outbox.exceptions import (
    ConfigurationError,
)
from outbox.ops import database

APP_ENV = "OUTBOX_APP"


class Context:
    """What the group options give every command.

    ``app_source`` and ``url_source`` name where ``--app`` and ``--database-url`` came from
    (the option, or its environment variable), for error messages.
    """

    def __init__(
        self,
        app_spec: str | None,
        database_url: str | None,
        *,
        app_source: str = "--app",
        url_source: str = "--database-url",
        database_name: str | None = None,
    ) -> None:
        self.app_spec = app_spec
        self.database_url = database_url
        self.database_name = database_name
        """``--database``: of an application serving several databases, the one named."""
        self.app_source = app_source
        self.url_source = url_source
        self._app: Outbox | None = None
        self._driver_loaded = False

    def app(self) -> Outbox:
        """The application named by ``--app`` / ``OUTBOX_APP``, on ``--database-url`` if given.

        Its database URL is parsed and its driver imported (nothing is connected to), so that
        a bad URL is a ConfigurationError naming where the URL came from.
        """
        app = self._bound_app()
        if not self._driver_loaded:
            url = self._url_if_any()
            if url is not None:  # with none, the command says so when it opens the engine
                load_driver(url, self._url_source())
            self._driver_loaded = True
        return app

    def _bound_app(self) -> Outbox:
        """The application, on the database ``--database`` names when it serves several."""
        app = self._loaded_app()
        return app if self.database_name is None else app.on(self.database_name)

    def database(self, name: str | None) -> Outbox:
        """The application on its database ``name`` (None: the application of one database,
        or the one ``--database`` names)."""
        return self.app() if name is None else self._loaded_app().on(name)

    def each_database(self) -> list[Outbox]:
        """The application on each database a command that goes through all of them works on:
        every database of an application serving several (unless ``--database`` names one),
        else the one database."""
        app = self._loaded_app()
        if self.database_name is not None or not app.serves_many:
            return [self.app()]
        views = [app.on(name) for name in app.databases()]
        if not views:
            raise ConfigurationError("this application's registry lists no database now")
        return views

    def url(self) -> URL:
        """The database URL the commands would use, parsed; its driver need not be installed."""
        url = self._url_if_any()
        if url is None:
            return self._bound_app().url  # raises: no URL anywhere, and says where to give one
        return url

    def _url_if_any(self) -> URL | None:
        """The database URL, parsed; None when neither the options nor the application give one."""
        if self.database_url:
            return parse_url(self.database_url, self.url_source)
        try:
            return self._bound_app().url
        except ConfigurationError:
            return None
        except (ArgumentError, ValueError) as error:
            # Outbox parses its own URL; the text is not at hand here, and not shown.
            what = (
                "its port is not a number"
                if isinstance(error, ValueError)
                else f"a database URL looks like {database.URL_FORM}"
            )
            raise ConfigurationError(f"{self._url_source()}: cannot parse it: {what}") from None

    def bare_app(self) -> Outbox:
        """The application if one is named, else an Outbox on the database URL alone."""
        if self.app_spec:
            return self.app()
        if self._app is None:
            url = self.database_url or os.environ.get(DATABASE_URL_ENV)
            if not url:
                raise click.UsageError(
                    f"no database: pass --database-url, set {DATABASE_URL_ENV}, or name an "
                    f"application with --app / {APP_ENV}"
                )
            source = self.url_source if self.database_url else DATABASE_URL_ENV
            load_driver(parse_url(url, source), source)
            self._app = Outbox(url)
        return self._app

    def _loaded_app(self) -> Outbox:
        """The application, imported once and pointed at ``--database-url`` if given (parsed
        by :meth:`app` and :meth:`url`, which name its source when it is malformed)."""
        if self._app is None:
            if not self.app_spec:
                raise click.UsageError(
                    f"no application: pass --app module:attribute or set {APP_ENV}"
                )
            app = load_app(self.app_spec, source=self.app_source)
            if self.database_name is not None and not app.serves_many:
                raise click.UsageError(
                    "--database names one of several databases; this application serves one"
                )
            if self.database_url:
                if app.serves_many:
                    raise click.UsageError(
                        "--database-url: this application serves several databases, each with "
                        "its URL; name one with --database"
                    )
                app.use_database(self.database_url)
            settle_heap()
            self._app = app
        return self._app

    def _url_source(self) -> str:
        if self.database_url:
            return self.url_source
        return f"the database URL of {self.app_source} {self.app_spec}"


def parse_url(url: str, source: str) -> URL:
    """Parse a database URL; a ConfigurationError naming ``source`` (never the password)."""
    # A ConfigurationError (exit 2, one line) rather than a click.UsageError: the command line
    # is well formed, and its synopsis would not help.
    try:
        return database.parse_url(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from error


def load_driver(url: URL, source: str) -> None:
    """Import the dialect and driver outbox will use for the URL (for an async driver's URL,
    its sync sibling's); a ConfigurationError naming ``source`` if missing."""
    try:
        database.load_driver(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"{source}: {error}") from error


# Collect cyclic garbage after this many new container objects instead of Python's 700. What a
# worker builds per event (a row, its JSON documents, a model instance and its state: some eight
# containers for a JSON buffer's event) lives until its batch is finished, and four threads hold
# four batches: at 10,000 a young-generation collection ran every batch or so, walking the live
# batches' objects to free none of them, and moved them on to older generations walked again;
# a sixth of a JSON buffer's CPU per event (benchmarks.worker_cpu --typed json). At 100,000 the
# objects of the batches in flight are freed, by their reference counts, before the count is
# reached. Cyclic garbage waits as long: at most some 100,000 objects.
GC_THRESHOLD = 100_000


def settle_heap() -> None:
    """Tune the garbage collector of an ``outbox`` process once the application is loaded.

    What the imports built (SQLAlchemy, the application's models: some 70,000 objects) stays
    for the process's life, so it is frozen out of the collector's sight: full collections
    during a drain and the collection at exit no longer walk it (exiting took 0.1 s more
    without it). Only the ``outbox`` command does this; a ``Worker`` embedded in an
    application leaves the application's collector alone.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD)


def load_app(spec: str, *, source: str = "--app") -> Outbox:
    """Import ``module:attribute`` (the current directory is importable) and check it.

    ``source`` names where the spec came from (``--app`` or ``OUTBOX_APP``) in errors.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.UsageError(f"{source} must look like module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise click.UsageError(
            f"{source} {spec}: cannot import {module_name!r}: {error}"
        ) from error
    except SystemExit as error:
        # A module that exits when imported (a script's `sys.exit()` outside its main guard)
        # would otherwise end the command silently with its own exit code.
        raise click.UsageError(
            f"{source} {spec}: importing {module_name!r} exited (SystemExit {error.code!r})"
        ) from error
    except Exception as error:
        raise click.UsageError(
            f"{source} {spec}: importing {module_name!r} raised {type(error).__name__}: {error} "
            f"(run `python -c 'import {module_name}'` for the traceback)"
        ) from error
    try:
        app = getattr(module, attribute)
    except AttributeError:
        found = sorted(n for n, v in vars(module).items() if isinstance(v, Outbox))
        hint = f"; Outbox objects in it: {', '.join(found)}" if found else ""
        raise click.UsageError(
            f"{source} {spec}: module {module_name!r} has no attribute {attribute!r}{hint}"
        ) from None
    if not isinstance(app, Outbox):
        raise click.UsageError(
            f"{source} {spec}: expected an outbox.Outbox instance (app = Outbox(...)), "
            f"found {_what_is(app)}"
        )
    return app


def _what_is(value: object) -> str:
    """A value in plain words: ``the class myapp.Base``, ``the module json``, ``an int``."""
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    if isinstance(value, ModuleType):
        return f"the module {value.__name__}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"the function {value.__qualname__}"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} ({value!r:.60})"
