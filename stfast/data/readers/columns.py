"""``--columns``: a CSV of another project's layout, read by naming its columns (issue 62 item 6).

Two layouts:

- **points**, one GPS point per row (the point CSV's, :mod:`stfast.data.readers.csv_points`, with other names):
  ``--columns trip_id=order,time=ts,lng=x,lat=y[,driver_id=user][,state=occupied]``;
- **polyline**, one trip per row: a column of ``[[lng, lat], ...]`` pairs (JSON), the trip's start time and the
  seconds between fixes: ``--columns polyline=coords,time=start,interval_s=15[,trip_id=id][,driver_id=user]``
  (:mod:`stfast.data.readers.polyline_csv`; without ``trip_id`` a trip is named by its line, ``line7``).

Column names match the header case-insensitively, blanks stripped; other columns (an unnamed index column) are
ignored. Times are ISO-8601 or Unix seconds, as in the point CSV. The mapping is in effect for the readers called
inside :func:`mapped` (a context variable: the readers' signatures stay those of every other format).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field
from typing import Iterator

POINT_KEYS = ("trip_id", "time", "lng", "lat", "driver_id", "state")
POINT_REQUIRED = ("trip_id", "time", "lng", "lat")
POLYLINE_KEYS = ("polyline", "time", "interval_s", "trip_id", "driver_id")
POLYLINE_REQUIRED = ("polyline", "time", "interval_s")
EXAMPLE = "trip_id=…,time=…,lng=…,lat=… (a point per row) or polyline=…,time=…,interval_s=… (a trip per row)"


@dataclass(frozen=True)
class ColumnMap:
    """A parsed ``--columns``: ``layout`` "points" or "polyline"; ``names`` {key: the file's column name, lower
    case}; ``interval_s`` seconds between a polyline's fixes (polyline layout)."""

    layout: str
    names: dict = field(default_factory=dict)
    interval_s: float | None = None


def parse_columns(spec: str) -> ColumnMap:
    """``spec`` as ``key=column,...`` (module doc). Raises ValueError naming --columns: an unknown or repeated key,
    a required one missing, an empty column name, an interval that is not a positive number of seconds."""
    pairs = {}
    for part in (p.strip() for p in str(spec).split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not value:
            raise ValueError(f"--columns: {part!r} is not key=column; give {EXAMPLE}")
        if key in pairs:
            raise ValueError(f"--columns: {key} given twice")
        pairs[key] = value
    layout = "polyline" if "polyline" in pairs else "points"
    keys, required = (POLYLINE_KEYS, POLYLINE_REQUIRED) if layout == "polyline" else (POINT_KEYS, POINT_REQUIRED)
    unknown = [k for k in pairs if k not in keys]
    if unknown:
        raise ValueError(f"--columns: unknown key {unknown[0]!r} for a {layout} layout (keys: {', '.join(keys)})")
    missing = [k for k in required if k not in pairs]
    if missing:
        raise ValueError(f"--columns: {', '.join(missing)} missing for a {layout} layout; give {EXAMPLE}")
    interval = None
    if layout == "polyline":
        try:
            interval = float(pairs.pop("interval_s"))
        except ValueError:
            raise ValueError("--columns: interval_s must be a number of seconds") from None
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"--columns: interval_s must be > 0 seconds, got {interval:g}")
    return ColumnMap(layout, {k: v.lower() for k, v in pairs.items()}, interval)


_current: contextvars.ContextVar[ColumnMap | None] = contextvars.ContextVar("stfast_columns", default=None)


def current() -> ColumnMap | None:
    """The mapping in effect (:func:`mapped`), or None."""
    return _current.get()


@contextlib.contextmanager
def mapped(columns: str | ColumnMap | None) -> Iterator[ColumnMap | None]:
    """Readers called inside read CSVs through ``columns`` (a ``--columns`` text or a ColumnMap; None: no mapping,
    the formats as they are). Raises ValueError for a bad text (:func:`parse_columns`)."""
    cmap = parse_columns(columns) if isinstance(columns, str) else columns
    token = _current.set(cmap)
    try:
        yield cmap
    finally:
        _current.reset(token)


def positions(path, line: int, header: list[str], cmap: ColumnMap) -> dict:
    """{key: column index} of ``cmap``'s columns in a header row. Raises TrajectoryFormatError (file, line) naming
    a column the header lacks and --columns."""
    from stfast.data.errors import TrajectoryFormatError
    from stfast.data.readers._common import shown

    names = [c.strip().lower() for c in header]
    out = {}
    for key, name in cmap.names.items():
        if name not in names:
            raise TrajectoryFormatError(path, line, key, f"no column {name!r} in the header ({shown(','.join(header))}), "
                                                         f"which --columns {key}={name} names")
        out[key] = names.index(name)
    return out
