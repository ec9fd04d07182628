"""Reader of the Kaggle ECML/PKDD 2015 taxi-trip file of Porto (``train.csv`` / ``test.csv``).

One row per trip, a header naming the columns (any order, case-insensitive; all quoted in the published file)::

    TRIP_ID,CALL_TYPE,ORIGIN_CALL,ORIGIN_STAND,TAXI_ID,TIMESTAMP,DAY_TYPE,MISSING_DATA,POLYLINE

``POLYLINE`` is a JSON list of ``[lng, lat]`` pairs (WGS-84 degrees), one GPS fix every 15 s from
``TIMESTAMP`` (Unix seconds of the trip's start). ``MISSING_DATA`` is ``True`` when fixes are missing from the
polyline: such a trip's times are unknown, so it is dropped (counted as ``missing_data``), as is a trip with an
empty polyline (``empty_polyline``). ``CALL_TYPE``, ``ORIGIN_*`` and ``DAY_TYPE`` are not used. Calendar ids are
local time in Europe/Lisbon (:data:`PORTO_TZ`). The published file repeats a few TRIP_IDs on distinct trips: a
repeat is kept as its own trip, its id suffixed ``#2``, ``#3``, ...

Blocks of rows are parsed by pyarrow and checked with numpy; a block where anything is amiss is read again
with :mod:`csv` and :mod:`json`, row by row, to name the bad line and field.
"""
from __future__ import annotations

import json
import math
import os
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import (_PARSE_CHUNK, _BadField, _collect_points, _iter_blocks, _Problems, shown,
                                         _read_ahead, _require_file, _TripCodes)
from stfast.data.trips import Trajectories

PORTO_TZ = "Europe/Lisbon"
PORTO_REQUIRED = ("TRIP_ID", "TAXI_ID", "TIMESTAMP", "MISSING_DATA", "POLYLINE")
"""Columns the header must name (the others of the published file are allowed and ignored)."""
PORTO_STEP_S = 15.0
"""Seconds between consecutive fixes of a polyline."""

_NUM = r"-?\d+(?:\.\d+)?"
_POLYLINE = rf"^\[(?:\[{_NUM},{_NUM}\](?:,\[{_NUM},{_NUM}\])*)?\]$"  # the published form; others: json.loads


class _PortoHeader:
    """The header row: positions of the columns read (names as written, for error messages)."""

    def __init__(self, path, no: int, row: list[str]):
        self.raw = [c.strip() for c in row]
        self.names = [c.upper() for c in self.raw]
        for name in PORTO_REQUIRED:
            if name not in self.names:
                raise TrajectoryFormatError(path, no, name, f"missing required column '{name}' (header: "
                                                            f"{shown(','.join(self.raw))})")
        self.i = {name: self.names.index(name) for name in PORTO_REQUIRED}


def read_porto(path: str | os.PathLike, *, on_error: str = "raise") -> Trajectories:
    """Read a Kaggle Porto taxi file (module doc) into :class:`~stfast.data.trips.Trajectories`.

    Returns:
        One trajectory per kept row, in file order: ``lng``, ``lat`` [N] float64 degrees; ``t`` [N] float64
        Unix seconds (``TIMESTAMP + 15 s × k`` for the k-th fix); ``state`` [N] float32 ones (hired trips);
        ``driver`` [T] ``TAXI_ID``; ``trip_id`` [T] ``TRIP_ID``; ``tz`` Europe/Lisbon. ``dropped`` counts
        ``missing_data`` and ``empty_polyline`` trips (and ``bad_line`` with ``on_error="skip"``), each listed
        in ``dropped_trips`` with its reason.

    Raises:
        TrajectoryFormatError: missing file or header, a required column missing; a row with another field
            count than the header, an empty TRIP_ID, a TIMESTAMP that is not an integer, MISSING_DATA neither
            True nor False, a POLYLINE that is not a JSON list of [lng, lat] number pairs or has lng outside
            [-180, 180] / lat outside [-90, 90] (1-based line; field = the column's name).
    """
    probs, codes, meta = _Problems(on_error), _TripCodes(), {}
    return _collect_points(path, iter_porto_blocks(path, probs, codes, meta), probs, codes, meta)


def iter_porto_blocks(path, probs: _Problems, codes: _TripCodes, meta: dict) -> Iterator[dict]:
    """The fixes of the Porto file ``path`` block by block: dicts of ``code`` [n] int64 (trip number in
    ``codes``, one per kept row), ``t``, ``lng``, ``lat`` [n] float64, ``state`` [n] float32 ones. Dropped rows
    are counted in ``probs``; ``meta`` gets ``tz`` and ``offsets`` (False). Raises as :func:`read_porto`."""
    from stfast.data.readers.csv_points import _find_header, _whole_rows

    p = _require_file(path)
    if p.is_dir():
        raise TrajectoryFormatError(path, None, None, "is a directory, expected a Porto CSV file")
    meta.update(tz=PORTO_TZ, offsets=False)
    header = None
    blocks = _whole_rows(_iter_blocks(p))
    for first, block in blocks:
        if first == 1 and block.startswith(b"\xef\xbb\xbf"):
            block = block[3:]
        header, first, block = _find_header(p, first, block, make=_PortoHeader)
        if header is not None:
            break
    if header is None:
        raise TrajectoryFormatError(path, None, None, "empty file: no header row")
    import itertools

    rest = itertools.chain([(first, block)], blocks)
    for (first, block), parsed in _read_ahead(rest, lambda fb: _parse_block(fb[1], header)):
        rows = _fast_rows(parsed) if parsed is not None else _slow_rows(p, first, block, header, probs)
        got = _add_rows(rows, codes, probs, str(p))
        if len(got["t"]):
            yield got


def _unique_key(codes: _TripCodes, trip: str) -> str:
    if trip not in codes.code:
        return trip
    k = 2
    while f"{trip}#{k}" in codes.code:
        k += 1
    return f"{trip}#{k}"


def _add_rows(rows, codes: _TripCodes, probs: _Problems, source: str) -> dict:
    """Codes and fixes of parsed rows ((trip, taxi, start s, missing, lng [k], lat [k]) each); rows with
    missing data or no fix are dropped and counted."""
    code, n, t0, lngs, lats = [], [], [], [], []
    for trip, taxi, ts, missing, x, y in rows:
        key = _unique_key(codes, trip)
        if missing:
            probs.drop_trip("missing_data", key)
            continue
        if len(x) == 0:
            probs.drop_trip("empty_polyline", key)
            continue
        code.append(codes.add(key, taxi, source))
        n.append(len(x))
        t0.append(ts)
        lngs.append(x)
        lats.append(y)
    n_a = np.asarray(n, np.int64)
    starts = np.repeat(np.asarray(t0, np.float64), n_a)
    within = np.arange(int(n_a.sum()), dtype=np.float64) - np.repeat(np.cumsum(n_a) - n_a, n_a)
    cat = (lambda a: np.concatenate(a).astype(np.float64, copy=False)) if n else (lambda a: np.zeros(0))
    return {"code": np.repeat(np.asarray(code, np.int64), n_a), "t": starts + PORTO_STEP_S * within,
            "lng": cat(lngs), "lat": cat(lats), "state": np.ones(int(n_a.sum()), np.float32)}


def _fast_rows(parsed: dict):
    """Rows of a block parsed by :func:`_parse_block`."""
    cuts = np.concatenate([[0], np.cumsum(parsed["n"])])
    x, y = parsed["lng"], parsed["lat"]
    for i, (trip, taxi, ts, miss) in enumerate(zip(parsed["trip"], parsed["taxi"], parsed["ts"], parsed["miss"])):
        yield trip, taxi, ts, miss, x[cuts[i]:cuts[i + 1]], y[cuts[i]:cuts[i + 1]]


def _parse_block(block, h: _PortoHeader) -> dict | None:
    """A block's rows parsed with pyarrow: ``trip``, ``taxi`` (lists of str), ``ts`` (list of int), ``miss``
    [r] bool, ``n`` [r] fixes per row (0 for missing-data rows), ``lng``, ``lat`` [sum n] float64; None when
    anything is off (the caller then reads the block row by row). Touches no shared state."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    if not block.isascii() or b"\r" in block:
        return None
    names = [f"c{i}" for i in range(len(h.names))]
    cols = {k: names[h.i[k]] for k in PORTO_REQUIRED}
    try:
        tab = pacsv.read_csv(
            pa.py_buffer(block), read_options=pacsv.ReadOptions(column_names=names, block_size=_PARSE_CHUNK),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in cols.values()},
                                                 include_columns=list(cols.values()), strings_can_be_null=False,
                                                 null_values=[], quoted_strings_can_be_null=False))
        col = {k: tab.column(c).combine_chunks() for k, c in cols.items()}
        if tab.num_rows == 0:
            return {"trip": [], "taxi": [], "ts": [], "miss": np.zeros(0, bool), "n": np.zeros(0, np.int64),
                    "lng": np.zeros(0), "lat": np.zeros(0)}
        ts = pc.cast(col["TIMESTAMP"], pa.int64())
        if not pc.all(pc.is_in(col["MISSING_DATA"], pa.array(["True", "False"]))).as_py():
            return None
        miss = pc.equal(col["MISSING_DATA"], "True")
        poly = pc.if_else(miss, "[]", col["POLYLINE"])
        if (not pc.all(pc.match_substring_regex(poly, _POLYLINE)).as_py()
                or pc.min(pc.utf8_length(col["TRIP_ID"])).as_py() == 0):
            return None
        parts = pc.split_pattern(pc.replace_substring_regex(poly, r"[\[\]]", ""), ",")
        n = pc.list_value_length(parts).to_numpy(zero_copy_only=False).astype(np.int64)
        n[pc.equal(poly, "[]").to_numpy(zero_copy_only=False)] = 0
        flat = pc.list_flatten(pc.filter(parts, pa.array(n > 0)))
        v = pc.cast(flat, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    x, y = v[0::2], v[1::2]
    if len(x) and (np.abs(x).max() > 180.0 or np.abs(y).max() > 90.0):
        return None
    if len(x) != len(y) or (n % 2).any():
        return None
    return {"trip": col["TRIP_ID"].to_pylist(), "taxi": col["TAXI_ID"].to_pylist(), "ts": ts.to_pylist(),
            "miss": miss.to_numpy(zero_copy_only=False), "n": n // 2, "lng": x, "lat": y}


def _slow_rows(path, first: int, block: bytes, h: _PortoHeader, probs: _Problems):
    """A block's rows read by the csv and json modules, checked one by one (the exact checks and messages)."""
    from stfast.data.readers.csv_points import _data_rows

    f = {k: h.raw[h.i[k]] for k in PORTO_REQUIRED}  # the names as written, for messages
    for no, row in _data_rows(path, first, block, probs):
        trip = None
        try:
            if len(row) != len(h.names):
                raise _BadField(None, f"expected {len(h.names)} fields as in the header, got {len(row)}")
            trip = row[h.i["TRIP_ID"]].strip()
            if not trip:
                raise _BadField(f["TRIP_ID"], "empty")
            if not (trip + "".join(row)).isascii():
                try:
                    "".join(row).encode("utf-8")
                except UnicodeEncodeError:
                    raise _BadField(None, "row is not valid UTF-8 text") from None
            text = row[h.i["TIMESTAMP"]].strip()
            try:
                ts = int(text)
            except ValueError:
                raise _BadField(f["TIMESTAMP"], f"not an integer of Unix seconds: {text!r}") from None
            miss = row[h.i["MISSING_DATA"]].strip().lower()
            if miss not in ("true", "false"):
                raise _BadField(f["MISSING_DATA"], f"neither True nor False: {row[h.i['MISSING_DATA']]!r}")
            x, y = (np.zeros(0), np.zeros(0)) if miss == "true" else _polyline(row[h.i["POLYLINE"]], f["POLYLINE"])
            yield trip, row[h.i["TAXI_ID"]].strip(), ts, miss == "true", x, y
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason, trip=trip)


def _polyline(text: str, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(lng, lat) [k] float64 of a POLYLINE's JSON text; _BadField(field) when it is not a list of [lng, lat]
    number pairs in range."""
    try:
        v = json.loads(text)
    except ValueError as e:
        raise _BadField(field, f"not JSON: {e}") from None
    if not isinstance(v, list):
        raise _BadField(field, f"not a JSON list of [lng, lat] pairs: {text[:60]!r}")
    xs, ys = [], []
    for k, pt in enumerate(v):
        if (not isinstance(pt, list) or len(pt) != 2
                or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in pt)):
            raise _BadField(field, f"fix {k} is not a [lng, lat] pair of numbers: {pt!r}")
        x, y = float(pt[0]), float(pt[1])
        if not (math.isfinite(x) and -180.0 <= x <= 180.0):
            raise _BadField(field, f"fix {k}: longitude {x} outside [-180, 180]")
        if not (math.isfinite(y) and -90.0 <= y <= 90.0):
            raise _BadField(field, f"fix {k}: latitude {y} outside [-90, 90]")
        xs.append(x)
        ys.append(y)
    return np.array(xs, np.float64), np.array(ys, np.float64)
