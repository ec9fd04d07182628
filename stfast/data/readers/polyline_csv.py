"""Reader of a CSV with one trip per row, its fixes a JSON list of ``[lng, lat]`` pairs, in the columns that
``--columns polyline=…,time=…,interval_s=…[,trip_id=…][,driver_id=…]`` names (:mod:`.columns`): fix k of a trip is
at ``time + k · interval_s``. ``time`` is ISO-8601 or Unix seconds (as in the point CSV; an ISO offset is kept per
fix). Rows are read with the :mod:`csv` and :mod:`json` modules, block by block (bounded memory); a bad row names its
line and column. A trip with an empty polyline is dropped and counted (``empty_polyline``); without a ``trip_id``
column a trip is named by its line (``line7``).
"""
from __future__ import annotations

import itertools
import os
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _BadField, _collect_points, _iter_blocks, _Problems, _require_file, _TripCodes
from stfast.data.readers.columns import current, positions
from stfast.data.tz import TZ_FROM_TIMESTAMPS


def read_polyline_csv(path: str | os.PathLike, *, on_error: str = "raise"):
    """Read a polyline CSV (module doc; the mapping of :func:`.columns.mapped` in effect) into
    :class:`~stfast.data.trips.Trajectories`: one trajectory per kept row, ``state`` 0, ``driver`` the
    ``driver_id`` column's value (else ""). Raises TrajectoryFormatError: missing file or header, a mapped column
    missing, a row with too few fields, an empty trip id, a bad time, a polyline that is not a JSON list of
    [lng, lat] pairs in range; ValueError when no polyline mapping is in effect."""
    probs, codes, meta = _Problems(on_error), _TripCodes(), {}
    return _collect_points(path, iter_polyline_blocks(path, probs, codes, meta), probs, codes, meta)


def iter_polyline_blocks(path, probs: _Problems, codes: _TripCodes, meta: dict) -> Iterator[dict]:
    """The fixes of the polyline CSV ``path`` block by block: dicts of ``code``, ``t``, ``off`` (UTC offsets, NaN:
    none), ``lng``, ``lat``, ``state`` [n] (as the point readers', see :func:`read_polyline_csv`); ``meta`` gets
    ``offsets`` and ``tz`` once exhausted."""
    from stfast.data.readers.csv_points import _data_rows, _find_header, _whole_rows

    cmap = current()
    if cmap is None or cmap.layout != "polyline":
        raise ValueError("read_polyline_csv: give the columns (--columns polyline=…,time=…,interval_s=…)")
    p = _require_file(path)
    if p.is_dir():
        raise TrajectoryFormatError(path, None, None, "is a directory, expected a CSV file")
    blocks = _whole_rows(_iter_blocks(p))
    header = None
    for first, block in blocks:
        if first == 1 and block.startswith(b"\xef\xbb\xbf"):
            block = block[3:]
        header, first, block = _find_header(p, first, block, make=lambda pth, no, row: (row, positions(pth, no, row,
                                                                                                       cmap)))
        if header is not None:
            break
    if header is None:
        raise TrajectoryFormatError(path, None, None, "empty file: no header row")
    row0, pos = header
    names = {k: row0[i].strip() for k, i in pos.items()}  # as written, for messages
    any_offset = False
    for first, block in itertools.chain([(first, block)], blocks):
        got = _rows(p, first, block, pos, names, cmap.interval_s, probs, codes, _data_rows)
        if len(got["t"]):
            any_offset = any_offset or bool(np.isfinite(got["off"]).any())
            yield got
    meta["offsets"] = any_offset
    meta["tz"] = TZ_FROM_TIMESTAMPS if any_offset else "UTC"


def _rows(path, first, block, pos, names, interval, probs, codes, data_rows) -> dict:
    from stfast.data.readers.csv_points import parse_timestamp_offset
    from stfast.data.readers.porto import _polyline, _unique_key

    code, n, t0, off, xs, ys = [], [], [], [], [], []
    need = max(pos.values()) + 1
    for no, row in data_rows(path, first, block, probs):
        trip = None
        try:
            if len(row) < need:
                raise _BadField(None, f"{len(row)} fields, fewer than the header's mapped columns need ({need})")
            trip = row[pos["trip_id"]].strip() if "trip_id" in pos else f"line{no}"
            if not trip:
                raise _BadField(names["trip_id"], "empty")
            t, o = parse_timestamp_offset(row[pos["time"]].strip(), names["time"])
            x, y = _polyline(row[pos["polyline"]], names["polyline"])
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason, trip=trip)
            continue
        trip = _unique_key(codes, trip)  # a repeated id is another trip (as Porto's): its fixes are not merged
        if len(x) == 0:
            probs.drop_trip("empty_polyline", trip)
            continue
        driver = row[pos["driver_id"]].strip() if "driver_id" in pos else ""
        code.append(codes.add(trip, driver, str(path)))
        n.append(len(x))
        t0.append(t)
        off.append(o)
        xs.append(x)
        ys.append(y)
    n_a = np.asarray(n, np.int64)
    k = np.arange(int(n_a.sum()), dtype=np.float64) - np.repeat(np.cumsum(n_a) - n_a, n_a)
    cat = (lambda a: np.concatenate(a).astype(np.float64, copy=False)) if n else (lambda a: np.zeros(0))
    return {"code": np.repeat(np.asarray(code, np.int64), n_a),
            "t": np.repeat(np.asarray(t0, np.float64), n_a) + interval * k,
            "off": np.repeat(np.asarray(off, np.float64), n_a), "lng": cat(xs), "lat": cat(ys),
            "state": np.zeros(int(n_a.sum()), np.float32)}
