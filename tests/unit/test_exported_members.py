"""The public surface: outbox.__all__ is sorted, importable and exactly what is exported."""

from __future__ import annotations

import types

import outbox


def test_all_is_sorted() -> None:
    """__all__ is kept in sorted order."""
    assert sorted(outbox.__all__) == outbox.__all__


def test_all_has_no_duplicates() -> None:
    """Each public name is listed once."""
    assert len(set(outbox.__all__)) == len(outbox.__all__)


def test_every_name_in_all_is_importable() -> None:
    """Every name in __all__ resolves to an object of the package."""
    missing = [name for name in outbox.__all__ if not hasattr(outbox, name)]
    assert [] == missing


def test_all_is_exactly_the_public_namespace() -> None:
    """Every public, non-module name of the package is in __all__, and nothing else is."""
    public = {
        name
        for name, value in vars(outbox).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(outbox.__all__)


def test_design_vocabulary_is_exported() -> None:
    """The names the design promises users are part of the public API."""
    vocabulary = {
        "Outbox",
        "BufferMixin",
        "Batch",
        "Urgency",
        "RetryPolicy",
        "add_events",
        "add_events_async",
    }
    assert set() == vocabulary - set(outbox.__all__)


def test_every_exported_exception_derives_from_outbox_error() -> None:
    """One exception root: every exported exception class is an OutboxError."""
    exceptions = [
        getattr(outbox, name)
        for name in outbox.__all__
        if isinstance(getattr(outbox, name), type)
        and issubclass(getattr(outbox, name), BaseException)
    ]
    assert [] == [e.__name__ for e in exceptions if not issubclass(e, outbox.OutboxError)]
