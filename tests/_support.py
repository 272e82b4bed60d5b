"""What every tier of the tests shares."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_SECONDS = 20.0
"""How long a wait lasts before it fails: only a broken run waits that long."""
POLL_SECONDS = 0.02


def wait_for(condition: Callable[[], T], what: str, timeout: float = WAIT_SECONDS) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_SECONDS)
