"""DeepTTE JSON-lines reader (UrbComp/DeepTTE ``data/train_0*``, ``data/test``).

Each non-blank line is one JSON object, one trip (Wang et al., "When Will You Arrive? Estimating
Travel Time Based on Deep Neural Networks", AAAI 2018; https://github.com/UrbComp/DeepTTE)::

    {"time_gap": [0.0, 20.0, ...], "dist_gap": [0.0, 0.28, ...], "lngs": [...], "lats": [...],
     "states": [1.0, ...], "dist": 8.96, "time": 816.0, "driverID": 2725, "weekID": 3,
     "timeID": 606, "dateID": 27}

``time_gap`` (s) and ``dist_gap`` (km) are cumulative from the first point; ``time`` is the label
(seconds, equal to ``time_gap[-1]``); ``timeID`` is the minute of day of departure.

Optional keys, written by :meth:`stfast.data.trips.Trips.to_jsonl` (the original data has none):
``tripID`` (str or int: the input trip's id), ``segment`` (int >= 0: its piece number) and ``tz``
(the time zone the calendar ids were computed in).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _BadField, _iter_lines, _Problems, _require_file
from stfast.data.trips import DroppedTrips, Trips, lengths_to_offsets
from stfast.data.tz import check_tz

DEEPTTE_LIST_KEYS = ("lngs", "lats", "states", "time_gap", "dist_gap")
DEEPTTE_SCALAR_KEYS = ("dist", "time", "driverID", "weekID", "timeID", "dateID")
DEEPTTE_KEYS = DEEPTTE_LIST_KEYS + DEEPTTE_SCALAR_KEYS
"""Keys every DeepTTE record must have."""
DEEPTTE_TZ = "Asia/Shanghai"
"""Time zone of records without a ``tz`` key (the original data: Chengdu)."""

DIST_GAP_TOLERANCE_KM = 1e-3  # |dist_gap[0]| allowed (1 m)
_MONOTONE_SLACK = 1e-9  # float noise allowed in the cumulative lists


def _number_list(rec: dict, key: str) -> list:
    v = rec[key]
    if not isinstance(v, list):
        raise _BadField(key, f"expected a list, got {type(v).__name__}")
    if not v:
        raise _BadField(key, "empty list (a trip needs at least one point)")
    types = set(map(type, v))
    if not types <= {int, float}:
        bad = next(x for x in v if type(x) not in (int, float))
        raise _BadField(key, f"non-numeric value {bad!r}")
    if float in types and not all(math.isfinite(x) for x in v):
        raise _BadField(key, "non-finite value")
    return v


def _number(rec: dict, key: str) -> float:
    v = rec[key]
    if type(v) not in (int, float):
        raise _BadField(key, f"expected a number, got {v!r}")
    if not math.isfinite(v):
        raise _BadField(key, f"not finite: {v!r}")
    return float(v)


def _integer(rec: dict, key: str, lo: int | None, hi: int | None) -> int:
    v = rec[key]
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int:
        raise _BadField(key, f"expected an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _BadField(key, f"{v} outside [{lo}, {'∞' if hi is None else hi}]")
    return v


def _trip_key(rec) -> str | None:
    """The record's own ``tripID`` as str, None when it has none; _BadField when not str/int."""
    v = rec.get("tripID") if isinstance(rec, dict) else None
    if v is None:
        return None
    if type(v) not in (int, str) or v == "":
        raise _BadField("tripID", f"expected a non-empty string or an integer, got {v!r}")
    return str(v)


def _parse_record(rec, tol: float) -> tuple:
    if not isinstance(rec, dict):
        raise _BadField(None, f"expected a JSON object, got {type(rec).__name__}")
    for k in DEEPTTE_KEYS:
        if k not in rec:
            raise _BadField(k, "key is missing")
    lists = {k: _number_list(rec, k) for k in DEEPTTE_LIST_KEYS}
    n = len(lists["lngs"])
    for k in DEEPTTE_LIST_KEYS[1:]:
        if len(lists[k]) != n:
            raise _BadField(k, f"has {len(lists[k])} values but lngs has {n}")
    lng = np.array(lists["lngs"], dtype=np.float64)
    lat = np.array(lists["lats"], dtype=np.float64)
    tg = np.array(lists["time_gap"], dtype=np.float64)
    dg = np.array(lists["dist_gap"], dtype=np.float64)
    if np.any(np.abs(lat) > 90.0):
        raise _BadField("lats", f"latitude outside [-90, 90] at index {int(np.argmax(np.abs(lat) > 90))}")
    if np.any(np.abs(lng) > 180.0):
        raise _BadField("lngs", f"longitude outside [-180, 180] at index {int(np.argmax(np.abs(lng) > 180))}")
    if abs(tg[0]) > tol:
        raise _BadField("time_gap", f"must start at 0 (cumulative), starts at {tg[0]}")
    if abs(dg[0]) > DIST_GAP_TOLERANCE_KM:
        raise _BadField("dist_gap", f"must start at 0 (cumulative), starts at {dg[0]}")
    for k, a in (("time_gap", tg), ("dist_gap", dg)):
        d = np.diff(a)
        if np.any(d < -_MONOTONE_SLACK):
            i = int(np.argmax(d < -_MONOTONE_SLACK)) + 1
            raise _BadField(k, f"not cumulative: decreases at index {i} ({a[i - 1]} -> {a[i]})")
    dist = _number(rec, "dist")
    time = _number(rec, "time")
    if dist < 0:
        raise _BadField("dist", f"negative: {dist}")
    if not time > 0:  # MAPE divides by it: a zero-time trip would make every metric infinite
        raise _BadField("time", f"must be > 0 s (the trip's travel time), got {time}")
    if abs(time - tg[-1]) > tol:
        raise _BadField("time", f"time {time} != time_gap[-1] {tg[-1]} (tolerance {tol} s)")
    drv = rec["driverID"]
    if type(drv) not in (int, str):
        raise _BadField("driverID", f"expected an integer or string, got {drv!r}")
    week = _integer(rec, "weekID", 0, 6)
    tid = _integer(rec, "timeID", 0, 1439)
    date = _integer(rec, "dateID", 0, None)
    state = np.array(lists["states"], dtype=np.float32)
    seg = _integer(rec, "segment", 0, None) if "segment" in rec else 0
    tz = rec.get("tz")
    if tz is not None:
        try:
            check_tz(tz)
        except ValueError as e:
            raise _BadField("tz", str(e)) from None
    return lng, lat, state, tg, dg, dist, time, str(drv), week, tid, date, seg, tz


def deeptte_files(folder: Path) -> list[Path]:
    """The files a folder of DeepTTE JSON-lines files is read from: its regular, non-hidden files (not its
    subfolders), in name order (the original DeepTTE data is such a folder: ``train_00`` … ``train_04``)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def read_deeptte_jsonl(
    path: str | os.PathLike, *, on_error: str = "raise", time_tolerance_s: float = 1.0
) -> Trips:
    """Read a DeepTTE JSON-lines file, or a folder of them, into :class:`~stfast.data.trips.Trips`.

    Blank lines are ignored. Every record needs the keys :data:`DEEPTTE_KEYS`. A folder is read file by file
    (:func:`deeptte_files`, name order) and its trips concatenated; a record without ``tripID`` is then
    identified as ``<file name>:<line>``, unique across the files.

    Returns:
        Trips in file order: ``lng``, ``lat`` [N] float64 degrees; ``state`` [N] float32;
        ``time_gap`` [N] float64 s and ``dist_gap`` [N] float64 km (cumulative, as stored);
        ``dist`` [T] float64 km; ``time`` [T] float64 s; ``driver`` [T] object ``str(driverID)``;
        ``week_id``, ``time_id``, ``date_id`` [T] int64; ``trip_id`` [T] object str (the record's
        ``tripID``, else its 1-based line number); ``segment`` [T] int64 (``segment``, else 0).
        ``dropped`` counts skipped lines (``{"bad_line": k}``) with ``on_error="skip"``, or
        ``{"empty_file": 1}`` for a file without records (with a warning); ``dropped_trips`` lists the
        skipped lines (trip id as above, reason "bad_line"). ``tz``: the records' ``tz`` (all records
        agreeing; sorted and comma-joined when they differ), :data:`DEEPTTE_TZ` where they have none.
        ``preprocess_config`` None.

    Raises:
        TrajectoryFormatError (path, 1-based line, JSON key): invalid JSON or not an object; a missing
        key; the 5 lists not lists of finite numbers of equal length ≥ 1; lat outside [-90, 90] or
        lng outside [-180, 180]; ``time_gap`` not starting within ``time_tolerance_s`` of 0 or
        ``dist_gap`` not within 1 m of 0; either list decreasing; ``dist`` negative or not finite; ``time`` not > 0;
        ``|time - time_gap[-1]| > time_tolerance_s``; ``driverID`` not int/str; ``weekID`` not an
        integer in 0..6, ``timeID`` not in 0..1439, ``dateID`` negative; an optional key of the wrong
        type (``tripID`` not a non-empty str/int, ``segment`` not an integer >= 0, ``tz`` not a
        time-zone name).
    """
    path = _require_file(path)
    if not path.is_dir():
        return _read_file(path, on_error, time_tolerance_s, "")
    files = deeptte_files(path)
    if not files:
        raise TrajectoryFormatError(path, None, None, "folder holds no files (expected DeepTTE JSON-lines files)")
    parts = [_read_file(f, on_error, time_tolerance_s, f"{f.name}:") for f in files]
    trips = Trips.concat(parts)
    trips.tz = ", ".join(sorted({z for p in parts for z in p.tz.split(", ")}))
    return trips


def _read_file(path: Path, on_error: str, time_tolerance_s: float, id_prefix: str) -> Trips:
    """One JSON-lines file (see read_deeptte_jsonl); a record without tripID is ``id_prefix`` + its line."""
    probs = _Problems(on_error)
    recs, ids, bad = [], [], []  # bad: (trip id, segment) of skipped lines
    for no, line in _iter_lines(path):
        if line is None:
            probs.bad(path, no, None, "line is not valid UTF-8 text")
            continue
        if not line.strip():
            continue
        trip, seg = f"{id_prefix}{no}", 0
        try:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, or an integer of > 4300 digits
                raise _BadField(None, f"invalid JSON: {e}") from None
            try:
                if isinstance(obj, dict) and type(obj.get("segment")) is int:
                    seg = obj["segment"]
                trip = _trip_key(obj) or trip
                recs.append(_parse_record(obj, time_tolerance_s))
                ids.append(trip)
            except OverflowError:
                raise _BadField(None, "number too large for float64") from None
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason)
            bad.append((trip, seg))
    probs.warn(path)
    if not recs and not probs.dropped:
        logging.getLogger("stfast.data").warning("%s: no records (empty file)", path)
        probs.count("empty_file")
    cols = list(zip(*recs)) if recs else [()] * 13
    zones = sorted({DEEPTTE_TZ if z is None else z for z in cols[12]})
    f64, i64 = np.zeros(0, np.float64), np.zeros(0, np.int64)
    lengths = np.array([len(a) for a in cols[0]], dtype=np.int64)
    return Trips(
        offsets=lengths_to_offsets(lengths),
        lng=np.concatenate(cols[0]) if recs else f64,
        lat=np.concatenate(cols[1]) if recs else f64,
        state=np.concatenate(cols[2]) if recs else np.zeros(0, np.float32),
        time_gap=np.concatenate(cols[3]) if recs else f64,
        dist_gap=np.concatenate(cols[4]) if recs else f64,
        dist=np.array(cols[5], dtype=np.float64),
        time=np.array(cols[6], dtype=np.float64),
        driver=np.array(cols[7], dtype=object),
        week_id=np.array(cols[8], dtype=np.int64) if recs else i64,
        time_id=np.array(cols[9], dtype=np.int64) if recs else i64,
        date_id=np.array(cols[10], dtype=np.int64) if recs else i64,
        trip_id=np.array(ids, dtype=object),
        segment=np.array(cols[11], dtype=np.int64) if recs else i64,
        dropped=dict(probs.dropped),
        dropped_trips=DroppedTrips.of([i for i, _ in bad], "bad_line", [s for _, s in bad]),
        tz=", ".join(zones) if zones else DEEPTTE_TZ,
    )
