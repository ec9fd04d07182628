"""A count with its noun in the right number, for messages people read: "1 trip", "2 trips", "0 trips"."""
from __future__ import annotations

import numbers


def counted(n, noun: str, plural: str | None = None, spec: str = "") -> str:
    """``n`` followed by ``noun`` when ``n`` is 1, else by ``plural`` (default ``noun`` + "s"): ``counted(1,
    "trip")`` → "1 trip", ``counted(1200, "trip", spec=",")`` → "1,200 trips". ``spec``: the format spec of
    ``n`` (a number); ``n`` that is not a number (a summary's "?") is written as it is, with the plural."""
    text = format(n, spec) if isinstance(n, numbers.Real) else str(n)
    return f"{text} {noun if n == 1 else plural or noun + 's'}"
