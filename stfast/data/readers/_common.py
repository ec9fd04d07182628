"""Helpers shared by the reader modules: error counting, line iteration, path checks."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Iterator

from stfast.data.errors import TrajectoryFormatError
from stfast.data.trips import DroppedTrips

log = logging.getLogger("stfast.data")



def _check_on_error(on_error: str) -> bool:
    """True for "skip", False for "raise"; anything else is a programming error (ValueError)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    return on_error == "skip"


class _Problems:
    """Raise (on_error="raise") or count (on_error="skip") bad records; one summary warning at the end."""

    def __init__(self, on_error: str):
        self.skip = _check_on_error(on_error)
        self.dropped: dict[str, int] = {}
        self.first: TrajectoryFormatError | None = None
        self._bad_trips: dict[str, None] = {}  # ids of trips with a skipped record, in order

    def bad(self, path, line: int | None, field: str | None, reason: str, kind: str = "bad_line",
            trip: str | None = None) -> None:
        """A bad record at ``line`` (of trip ``trip`` when its id is known): raise or count it."""
        err = TrajectoryFormatError(path, line, field, reason)
        if not self.skip:
            raise err
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        if self.first is None:
            self.first = err
        if trip:
            self._bad_trips[trip] = None

    def dropped_trips(self, kept) -> DroppedTrips:
        """Rows (reason "bad_line") for the trips with a skipped record that are not in ``kept``."""
        return DroppedTrips.of([i for i in self._bad_trips if i not in kept], "bad_line")

    def count(self, kind: str, n: int = 1) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + n

    def warn(self, where) -> None:
        """Log one warning summarising the skipped bad records (not other counts)."""
        if self.first is not None:
            what = ", ".join(f"{v} {k}" for k, v in sorted(self.dropped.items()))
            log.warning("%s: skipped %s (first: %s)", where, what, self.first)


class _BadField(Exception):
    """Internal: a record is bad; carries the field name and the reason (never escapes a reader)."""

    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _finite(text: str, field: str) -> float:
    """Parse a finite float from one text field; _BadField naming the field otherwise."""
    try:
        v = float(text)
    except ValueError:
        raise _BadField(field, f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise _BadField(field, f"not a finite number: {text!r}")
    return v


def _lng_lat(lng_text: str, lat_text: str) -> tuple[float, float]:
    """Parse and range-check one coordinate pair (degrees); _BadField naming lng or lat otherwise."""
    x, y = _finite(lng_text, "lng"), _finite(lat_text, "lat")
    if not -180.0 <= x <= 180.0:
        raise _BadField("lng", f"longitude {x} outside [-180, 180]")
    if not -90.0 <= y <= 90.0:
        raise _BadField("lat", f"latitude {y} outside [-90, 90]")
    return x, y


def _require_file(path) -> Path:
    p = Path(path)
    if not p.exists():
        raise TrajectoryFormatError(path, None, None, "no such file")
    return p


def _iter_lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(1-based line number, text without line ending) for every line; text None if not UTF-8.

    Reads in binary so CRLF and LF give identical text and a bad byte spoils only its own line.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    with f:
        for i, raw in enumerate(f, 1):
            try:
                yield i, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield i, None


def _is_didi_data_file(p: Path) -> bool:
    """A DiDi GAIA point file name: gps_* with no extension (or .csv/.txt), so gps_*.sha256 is not one."""
    return p.name.startswith("gps_") and p.suffix.lower() in ("", ".csv", ".txt") and p.is_file()
