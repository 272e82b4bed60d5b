"""The ``outbox`` command tunes its own process's garbage collector once the app is loaded."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from outbox import cli


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The test process's collector as it was, whatever the test did to it."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_loading_the_application_freezes_the_heap_and_raises_the_threshold(
    restored_collector: None,
) -> None:
    gc.unfreeze()
    cli.Context("tests.acceptance.cli_app:app", None).app()
    assert (cli.GC_THRESHOLD, True) == (gc.get_threshold()[0], gc.get_freeze_count() > 0)
