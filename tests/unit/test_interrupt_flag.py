"""Ctrl-C as a flag (``interrupt_flag``): never lost, wherever the main thread is when it comes.

Python's own SIGINT handler raises KeyboardInterrupt in whatever code the main thread runs,
and drops it when that is a finalizer: a Ctrl-C during one of SQLAlchemy's weakref callbacks
went unnoticed, and ``outbox demo`` wrote and drained all its events regardless.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from outbox.cli._signals import interrupt_flag


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)  # the handler runs in the main thread, here, between two bytecodes


class _Finalized:
    def __del__(self) -> None:
        _ctrl_c()


def test_a_ctrl_c_during_a_finalizer_is_kept() -> None:
    with interrupt_flag() as interrupted:
        _Finalized()  # dropped at once: the Ctrl-C comes while its finalizer runs
        seen = interrupted.is_set()
    assert seen


def test_python_drops_a_ctrl_c_during_a_finalizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the flag: without it, the same Ctrl-C vanishes ("Exception ignored in ...")."""
    ignored: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: ignored.append(raised.exc_type))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _Finalized()
        went_on = True
    except KeyboardInterrupt:
        went_on = False
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (True, [KeyboardInterrupt]) == (went_on, ignored)


def test_a_second_ctrl_c_raises_at_once_and_the_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with interrupt_flag() as interrupted:
        _ctrl_c()
        first = interrupted.is_set()
        with pytest.raises(KeyboardInterrupt):
            _ctrl_c()
    assert (True, before) == (first, signal.getsignal(signal.SIGINT))
