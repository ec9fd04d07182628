"""Readers of trajectory files into the CSR containers of :mod:`stfast.data.trips`.

=========  ==========================================  ==================================
format     reader                                      result
=========  ==========================================  ==================================
deeptte    :func:`read_deeptte_jsonl` (JSON lines)     :class:`~stfast.data.trips.Trips`
geolife    :func:`read_geolife` (GeoLife 1.3 .plt)     :class:`~stfast.data.trips.Trajectories`
didi       :func:`read_didi_gaia` (DiDi GAIA gps_*)    :class:`~stfast.data.trips.Trajectories`
csv        :func:`read_csv_points` (point CSV)         :class:`~stfast.data.trips.Trajectories`
=========  ==========================================  ==================================

Common rules: every reader raises only :class:`~stfast.data.errors.TrajectoryFormatError` on bad
input (with the 1-based line number and the field name where they apply) and takes
``on_error="raise" | "skip"``; with ``"skip"`` a bad record is left out, counted in the result's
``.dropped`` dict, and one warning on the ``stfast.data`` logger says how many were skipped.
:func:`detect_format` guesses the format from the content; :func:`read_any` detects and reads.
"""
from __future__ import annotations

import csv
import logging
import os
import re
from pathlib import Path
from typing import Iterator

from stfast.data.errors import TrajectoryFormatError

log = logging.getLogger("stfast.data")

FORMATS = ("deeptte", "geolife", "didi", "csv")


# ---------------------------------------------------------------------------------------------------
# helpers shared by the reader modules (defined before they are imported below)


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

    def bad(self, path, line: int | None, field: str | None, reason: str, kind: str = "bad_line") -> None:
        err = TrajectoryFormatError(path, line, field, reason)
        if not self.skip:
            raise err
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        if self.first is None:
            self.first = err

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


# reader modules (import after the helpers above, which they use)
from stfast.data.readers.csv_points import CSV_REQUIRED, read_csv_points  # noqa: E402
from stfast.data.readers.deeptte_json import DEEPTTE_KEYS, read_deeptte_jsonl  # noqa: E402
from stfast.data.readers.didi_gaia import read_didi_gaia  # noqa: E402
from stfast.data.readers.geolife import GEOLIFE_EPOCH, GEOLIFE_HEADER_LINES, read_geolife  # noqa: E402

_DIDI_LINE = re.compile(r"[^,]+,[^,]+,\d{10},[^,]+,[^,]+")


def _first_nonblank_line(path: Path, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(limit)
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    if len(head) == limit and lines:
        lines = lines[:-1] if len(lines) > 1 else lines  # the last one may be cut
    for ln in lines:
        if ln.strip():
            return ln.strip()
    return None


def _unrecognized(path, detail: str) -> TrajectoryFormatError:
    return TrajectoryFormatError(
        path, None, None, f"could not recognize the format ({detail}); known formats: {', '.join(FORMATS)}"
    )


def detect_format(path: str | os.PathLike) -> str:
    """Guess the format of ``path`` from its content; returns one of :data:`FORMATS`.

    Rules, in order: a directory holding ``.plt`` files (at any depth) → ``"geolife"``; a directory
    holding ``gps_*`` files → ``"didi"``; a ``.plt`` file or one whose first line is
    ``Geolife trajectory`` → ``"geolife"``; first non-blank line starting with ``{`` → ``"deeptte"``;
    a header line whose comma-separated names include ``trip_id,timestamp,lng,lat`` → ``"csv"``;
    a line of 5 comma fields whose third is a 10-digit integer (no header) → ``"didi"``.

    Raises:
        TrajectoryFormatError: missing path ("no such file"), or nothing matched (the message lists
        the known formats).
    """
    p = _require_file(path)
    if p.is_dir():
        if next(iter(p.rglob("*.plt")), None) is not None:
            return "geolife"
        if any(_is_didi_data_file(c) for c in p.iterdir()):
            return "didi"
        raise _unrecognized(path, "directory holds neither .plt nor gps_* files")
    if p.suffix.lower() == ".plt":
        return "geolife"
    first = _first_nonblank_line(p)
    if first is None:
        raise _unrecognized(path, "file is empty")
    if first.startswith("{"):
        return "deeptte"
    if first.lower() == "geolife trajectory":
        return "geolife"
    try:
        names = {c.strip().lower() for c in next(csv.reader([first]))}
    except (csv.Error, StopIteration):
        names = set()
    if set(CSV_REQUIRED) <= names:
        return "csv"
    if _DIDI_LINE.fullmatch(first):
        return "didi"
    shown = first if len(first) <= 80 else first[:77] + "..."
    raise _unrecognized(path, f"first line {shown!r}")


_READERS = {
    "deeptte": read_deeptte_jsonl,
    "geolife": read_geolife,
    "didi": read_didi_gaia,
    "csv": read_csv_points,
}


def read_any(path: str | os.PathLike, format: str = "auto", *, on_error: str = "raise"):
    """Read ``path`` with the reader of ``format`` (``"auto"``: :func:`detect_format`).

    Returns :class:`~stfast.data.trips.Trips` for ``"deeptte"``, else
    :class:`~stfast.data.trips.Trajectories`. Logs the chosen format at INFO on ``stfast.data``.

    Raises:
        TrajectoryFormatError: missing path (``"no such file"``), unrecognised content, bad records.
        ValueError: ``format`` not ``"auto"`` nor one of :data:`FORMATS`, or a bad ``on_error``.
    """
    _check_on_error(on_error)
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, not {format!r}")
    _require_file(path)
    fmt = detect_format(path) if format == "auto" else format
    log.info("%s: reading as %s%s", path, fmt, " (detected)" if format == "auto" else "")
    return _READERS[fmt](path, on_error=on_error)


__all__ = [
    "FORMATS",
    "DEEPTTE_KEYS",
    "CSV_REQUIRED",
    "GEOLIFE_EPOCH",
    "GEOLIFE_HEADER_LINES",
    "detect_format",
    "read_any",
    "read_csv_points",
    "read_deeptte_jsonl",
    "read_didi_gaia",
    "read_geolife",
]
