"""How a duration reads to a person, everywhere outbox writes one for a person to read.

The command's text output, the console's pages and the sentences both share (alerts, pauses,
silent holders) read ``45 s``, ``3 min 5 s``, ``1 d 2 h``; what machines read (``--json``, the
HTTP API, the Prometheus metrics, log fields) keeps float seconds.
"""

from __future__ import annotations

import math

_UNITS = (("d", 86_400), ("h", 3600), ("min", 60), ("s", 1))


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them, to the two largest units: ``0 s``, ``0.4 s``,
    ``4.2 s``, ``59 s``, ``1 min``, ``3 min 5 s``, ``2 h 5 min``, ``1 d 2 h``, ``21 d``; a
    dash for none. Under 10 s to a tenth, then whole seconds; each smaller unit drops what
    is below it (59.9 s is ``59 s``, 2 h 5 min 59 s is ``2 h 5 min``). Weeks and longer
    read in days, which no one misreads. A negative duration reads with a minus sign."""
    if seconds is None or math.isnan(seconds):
        return "—"
    size = abs(seconds)
    if math.isinf(size):
        text = "∞"
    elif (tenths := round(size * 10)) < 100:
        text = f"{tenths // 10} s" if tenths % 10 == 0 else f"{tenths / 10:.1f} s"
    else:
        text = _two_units(max(int(size), 10))
    return f"-{text}" if seconds < 0 and text != "0 s" else text


def _two_units(whole: int) -> str:
    parts: list[tuple[int, str]] = []
    for unit, size in _UNITS:
        count, whole = divmod(whole, size)
        if parts or count:
            parts.append((count, unit))
    first, *rest = parts
    shown = [first] + [part for part in rest[:1] if part[0]]
    return " ".join(f"{count} {unit}" for count, unit in shown)


class Timed(str):
    """A sentence that reads as its text, its durations written by :func:`duration`, and
    keeps its parts: the text between them, and each duration as float seconds. A page
    draws each duration with its exact seconds on hover; any other reader has the text."""

    parts: tuple[str | float, ...]

    def __new__(cls, *parts: str | float) -> Timed:
        text = "".join(p if isinstance(p, str) else duration(p) for p in parts)
        sentence = super().__new__(cls, text)
        sentence.parts = parts
        return sentence

    def __add__(self, other: str) -> Timed:
        return Timed(*self.parts, *(other.parts if isinstance(other, Timed) else (other,)))

    def __radd__(self, other: str) -> Timed:
        return Timed(other, *self.parts)

    def __reduce__(self) -> tuple[type[Timed], tuple[str | float, ...]]:
        # A copy (dataclasses.asdict copies each alert) keeps the parts.
        return (Timed, self.parts)
