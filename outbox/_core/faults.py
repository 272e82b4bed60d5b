"""Named crash points for the fault-injection suite (tests/faults, docs/reliability.md).

``OUTBOX_CRASH_POINT=<name>`` makes the process kill itself with SIGKILL the
``OUTBOX_CRASH_AFTER``-th time (default: the first) it reaches that point; nothing else
changes. Unset (always, in production) a crash point costs one comparison.
"""

from __future__ import annotations

import os
import signal
import threading

CRASH_POINT_ENV = "OUTBOX_CRASH_POINT"
CRASH_AFTER_ENV = "OUTBOX_CRASH_AFTER"

AFTER_ACQUIRE = "after_acquire"  # jobs leased, none run yet
AFTER_CLAIM = "after_claim"  # a claim and its batch job committed
BEFORE_HANDLER = "before_handler"  # the group loaded, the handler not yet called
AFTER_HANDLER = "after_handler"  # the handler returned, nothing recorded yet
IN_COMPLETION = "in_completion"  # inside the finishing transaction, after the fence
AFTER_COMMIT = "after_commit"  # the finishing transaction committed
POINTS = (AFTER_ACQUIRE, AFTER_CLAIM, BEFORE_HANDLER, AFTER_HANDLER, IN_COMPLETION, AFTER_COMMIT)

_armed = os.environ.get(CRASH_POINT_ENV) or None
_remaining = int(os.environ.get(CRASH_AFTER_ENV) or 1)
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """Die here, at once and without cleanup, when this point is the armed one."""
    global _remaining
    if _armed != name:
        return
    with _lock:
        _remaining -= 1
        if _remaining > 0:
            return
    os.kill(os.getpid(), signal.SIGKILL)
