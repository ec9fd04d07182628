"""Generic point-CSV reader: one GPS point per row, a header naming the columns.

Header (columns in any order, matched by name after stripping blanks, case-insensitive; extra
columns ignored)::

    trip_id,timestamp,lng,lat[,driver_id][,state]

``timestamp`` is ISO-8601 (``2016-11-01T07:10:00+08:00``, ``2016-11-01 07:10:00Z``; naive = UTC)
or Unix seconds (a number). The UTC offset an ISO timestamp carries is kept per point
(``utc_offset_s``): by default preprocessing takes local time from it (UTC where a timestamp has
none), see :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`. ``lng``/``lat`` are WGS-84 degrees. Read with the stdlib :mod:`csv`
module (RFC 4180 quoting; UTF-8, an initial BOM is ignored).
"""
from __future__ import annotations

import csv
import datetime as _dt
import logging
import math
import os
from array import array

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _BadField, _finite, _lng_lat, _Problems, _require_file
from stfast.data.trips import DroppedTrips, Trajectories, lengths_to_offsets
from stfast.data.tz import TZ_FROM_TIMESTAMPS

CSV_REQUIRED = ("trip_id", "timestamp", "lng", "lat")
"""Columns the header must name."""
CSV_OPTIONAL = ("driver_id", "state")
"""Columns used when present (driver defaults to "", state to 0)."""

_UTC = _dt.timezone.utc



def parse_timestamp(text: str, field: str = "timestamp") -> float:
    """Unix seconds (float) of an ISO-8601 string (naive = UTC) or of a number (Unix seconds)."""
    return parse_timestamp_offset(text, field)[0]


def parse_timestamp_offset(text: str, field: str = "timestamp") -> tuple[float, float]:
    """(Unix seconds, UTC offset in seconds) of an ISO-8601 string or a number (Unix seconds).

    The offset is the one written in the text (``+08:00`` → 28800.0, ``Z`` → 0.0); NaN for a naive
    ISO time (read as UTC) or a number. Raises ``_BadField(field)`` on anything else.
    """
    s = text.strip()
    if s[-1:] in ("Z", "z"):  # fromisoformat accepts "Z" only from Python 3.11
        s = s[:-1] + "+00:00"
    try:
        v = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(v):
            raise _BadField(field, f"not a finite number: {text!r}")
        return v, math.nan
    try:
        d = _dt.datetime.fromisoformat(s)
    except ValueError:
        raise _BadField(field, f"neither ISO-8601 nor Unix seconds: {text!r}") from None
    if d.tzinfo is None:
        return d.replace(tzinfo=_UTC).timestamp(), math.nan
    return d.timestamp(), d.utcoffset().total_seconds()


def read_csv_points(path: str | os.PathLike, *, on_error: str = "raise") -> Trajectories:
    """Read a point CSV (see module doc) into :class:`~stfast.data.trips.Trajectories`.

    Returns:
        One trajectory per ``trip_id``, trips in order of first appearance, points within a trip
        sorted by time (stable; duplicate timestamps kept): ``lng``, ``lat`` [N] float64 degrees;
        ``t`` [N] float64 Unix seconds UTC; ``utc_offset_s`` [N] float64 seconds, the offset written
        in each timestamp (NaN where none), or None when no timestamp has one; ``state`` [N] float32
        (column ``state``, else 0); ``driver`` [T] object str (column ``driver_id`` of the trip's
        first row, else ""); ``trip_id`` [T] object str (column ``trip_id``); ``source`` [T] the
        path; ``mode`` None; ``tz`` :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS` when some timestamp
        has an offset, else "UTC". Blank rows are ignored. ``dropped["bad_line"]`` counts rows
        skipped with ``on_error="skip"``; ``dropped_trips`` lists (reason "bad_line") the trip ids
        all of whose rows were skipped.

    Raises:
        TrajectoryFormatError: missing file or header; a required column missing (named in the
            message) or a column named twice; a row with another field count than the header; an
            empty ``trip_id``; a bad timestamp; non-numeric/non-finite ``lng``/``lat``/``state``;
            lng outside [-180, 180] or lat outside [-90, 90]; one trip with two ``driver_id`` values
            (1-based line numbers; field = column name).
    """
    probs = _Problems(on_error)
    p = _require_file(path)
    if p.is_dir():
        raise TrajectoryFormatError(path, None, None, "is a directory, expected a CSV file")
    lng, lat, t, st, tzo = array("d"), array("d"), array("d"), array("d"), array("d")
    code = array("q")
    trips: dict[str, int] = {}
    drivers: list[str] = []
    try:
        f = open(p, newline="", encoding="utf-8-sig", errors="surrogateescape")
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    with f:
        reader = csv.reader(f)
        header = None
        idx: dict[str, int] = {}
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                if header is None:
                    raise TrajectoryFormatError(path, reader.line_num, None, f"CSV error: {e}") from None
                probs.bad(path, reader.line_num, None, f"CSV error: {e}")
                continue
            no = reader.line_num
            trip = None
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip().lower() for c in row]
                if not "".join(header).isascii():
                    try:
                        "".join(header).encode("utf-8")
                    except UnicodeEncodeError:
                        raise TrajectoryFormatError(path, no, None, "header is not valid UTF-8") from None
                for i, name in enumerate(header):
                    if name in idx and name in CSV_REQUIRED + CSV_OPTIONAL:
                        raise TrajectoryFormatError(path, no, name, f"column '{name}' named twice in the header")
                    idx.setdefault(name, i)
                for name in CSV_REQUIRED:
                    if name not in idx:
                        raise TrajectoryFormatError(
                            path, no, name, f"missing required column '{name}' (header: {','.join(header)})"
                        )
                i_trip, i_ts, i_lng, i_lat = (idx[k] for k in CSV_REQUIRED)
                i_drv, i_state = idx.get("driver_id"), idx.get("state")
                continue
            try:
                if len(row) != len(header):
                    raise _BadField(None, f"expected {len(header)} fields as in the header, got {len(row)}")
                joined = "".join(row)
                if not joined.isascii():
                    try:
                        joined.encode("utf-8")
                    except UnicodeEncodeError:
                        raise _BadField(None, "row is not valid UTF-8 text") from None
                trip = row[i_trip].strip()
                if not trip:
                    raise _BadField("trip_id", "empty")
                ts, off = parse_timestamp_offset(row[i_ts])
                x, y = _lng_lat(row[i_lng], row[i_lat])
                s = _finite(row[i_state], "state") if i_state is not None else 0.0
                drv = row[i_drv].strip() if i_drv is not None else ""
                c = trips.get(trip)
                if c is None:
                    c = trips[trip] = len(drivers)
                    drivers.append(drv)
                elif drivers[c] != drv:
                    raise _BadField("driver_id", f"trip {trip} has driver {drivers[c]!r}, now {drv!r}")
            except _BadField as e:
                probs.bad(path, no, e.field, e.reason, trip=trip)
                continue
            code.append(c)
            t.append(ts)
            tzo.append(off)
            lng.append(x)
            lat.append(y)
            st.append(s)
    if header is None:
        raise TrajectoryFormatError(path, None, None, "empty file: no header row")
    probs.warn(path)
    if not code and not probs.dropped:
        logging.getLogger("stfast.data").warning("%s: header only, no points", path)

    def arr(a, dt):
        return np.frombuffer(a, dtype=dt) if len(a) else np.zeros(0, dtype=dt)

    code_a, t_a, off_a = arr(code, np.int64), arr(t, np.float64), arr(tzo, np.float64)
    order = np.lexsort((t_a, code_a))
    lengths = np.bincount(code_a, minlength=len(drivers)).astype(np.int64)
    has_offsets = bool(np.isfinite(off_a).any())
    return Trajectories(
        offsets=lengths_to_offsets(lengths),
        lng=arr(lng, np.float64)[order],
        lat=arr(lat, np.float64)[order],
        t=t_a[order],
        state=arr(st, np.float64)[order].astype(np.float32),
        driver=np.array(drivers, dtype=object),
        source=np.array([str(path)] * len(drivers), dtype=object),
        mode=None,
        trip_id=np.array(list(trips), dtype=object),
        utc_offset_s=off_a[order] if has_offsets else None,
        dropped=dict(probs.dropped),
        dropped_trips=probs.dropped_trips(trips),
        tz=TZ_FROM_TIMESTAMPS if has_offsets else "UTC",
    )
