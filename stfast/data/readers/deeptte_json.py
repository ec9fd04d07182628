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
from stfast.data.readers._common import (_PARSE_CHUNK, _BadField, _block_lines, _iter_blocks, _Problems, _read_ahead,
                                         _require_file)
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
    subfolders), in name order (the original DeepTTE data is such a folder: ``train_00`` … ``train_04``), but a
    file that is one pretty-printed JSON document (a ``config.json`` of statistics beside the records: issue 62;
    it was read as records and failed as invalid JSON at its line 1)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and not _json_document(p))


def _json_document(path: Path, limit: int = 1 << 20) -> bool:
    """Whether ``path`` is one JSON document over several lines (not JSON lines): at most ``limit`` bytes, its first
    non-blank line not a whole JSON value, the whole text one."""
    try:
        if path.stat().st_size > limit:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    try:
        json.loads(first)
        return False  # a whole value on its first line: JSON lines (records), or one compact document
    except ValueError:
        pass
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


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
    done: dict = {}
    parts = list(iter_file_blocks(path, on_error, time_tolerance_s, id_prefix, done))
    trips = Trips.concat(parts)
    trips.dropped, trips.dropped_trips, trips.tz = done["dropped"], done["dropped_trips"], done["tz"]
    return trips


def iter_file_blocks(path: Path, on_error: str = "raise", time_tolerance_s: float = 1.0, id_prefix: str = "",
                     done: dict | None = None):
    """The trips of one JSON-lines file, block by block (:class:`~stfast.data.trips.Trips` of each block's
    records, in file order; see :func:`read_deeptte_jsonl` for the rules). A block is parsed by pyarrow's JSON
    reader and checked with numpy; one where that finds anything amiss is read again line by line
    (json.loads and the checks of :func:`_parse_record`), which names the line and key of the bad record.
    When exhausted, ``done`` holds the file's ``dropped`` counts, ``dropped_trips`` rows and ``tz``."""
    probs = _Problems(on_error)
    bad: list = []  # (trip id, segment) of skipped lines
    n, zones = 0, set()
    def fast(item):  # in _read_ahead's workers: the next blocks are parsed while this one is checked and stored
        return _fast_block(item[1], item[0], time_tolerance_s, id_prefix)

    # two blocks parsed side by side: the parse (pyarrow, numpy: without the GIL) outweighs storing a block, and
    # with 2 free cores the parse takes about half the wall time (pyarrow alone keeps a second core partly idle)
    for (first, block), got in _read_ahead(_iter_blocks(path), fast, workers=2):
        if got is None:
            got = _slow_block(path, first, block, probs, time_tolerance_s, id_prefix, bad)
        n += len(got["dist"])
        zones |= got["zones"]
        if len(got["dist"]):
            yield _block_trips(got)
    probs.warn(path)
    if not n and not probs.dropped:
        logging.getLogger("stfast.data").warning("%s: no records (empty file)", path)
        probs.count("empty_file")
    if done is not None:
        done.update(dropped=dict(probs.dropped), tz=", ".join(sorted(zones)) if zones else DEEPTTE_TZ,
                    dropped_trips=DroppedTrips.of([i for i, _ in bad], "bad_line", [s for _, s in bad]))


def _block_trips(p: dict) -> Trips:
    def a(k, dt):
        return np.asarray(p[k], dt)

    return Trips(
        offsets=lengths_to_offsets(a("lengths", np.int64)), lng=a("lng", np.float64), lat=a("lat", np.float64),
        state=a("state", np.float32), time_gap=a("time_gap", np.float64), dist_gap=a("dist_gap", np.float64),
        dist=a("dist", np.float64), time=a("time", np.float64), driver=a("driver", object),
        week_id=a("week_id", np.int64), time_id=a("time_id", np.int64), date_id=a("date_id", np.int64),
        trip_id=a("trip_id", object), segment=a("segment", np.int64), tz=", ".join(sorted(p["zones"])))


def _slow_block(path: Path, first: int, block: bytes, probs: _Problems, tol: float, id_prefix: str,
                bad: list) -> dict:
    """A block read line by line: json.loads and :func:`_parse_record` (the exact checks and messages)."""
    recs, ids = [], []
    for no, line in _block_lines(first, block):
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
                recs.append(_parse_record(obj, tol))
                ids.append(trip)
            except OverflowError:
                raise _BadField(None, "number too large for float64") from None
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason)
            bad.append((trip, seg))
    cols = list(zip(*recs)) if recs else [()] * 13
    f64 = np.zeros(0)
    return {"lengths": [len(a) for a in cols[0]],
            **{k: np.concatenate(cols[i]) if recs else f64 for i, k in
               enumerate(("lng", "lat", "state", "time_gap", "dist_gap"))},
            "dist": cols[5], "time": cols[6], "driver": np.array(cols[7], object), "week_id": cols[8],
            "time_id": cols[9], "date_id": cols[10], "segment": cols[11], "trip_id": np.array(ids, object),
            "zones": {DEEPTTE_TZ if z is None else z for z in cols[12]}}


def _schema():
    import pyarrow as pa

    lst = pa.list_(pa.float64())
    return pa.schema([(k, lst) for k in DEEPTTE_LIST_KEYS] + [("dist", pa.float64()), ("time", pa.float64())]
                     + [(k, pa.int64()) for k in ("weekID", "timeID", "dateID")])


def _fast_block(block: bytes, first: int, tol: float, id_prefix: str) -> dict | None:
    """A block's records parsed by pyarrow's JSON reader and checked with numpy, as :func:`_parse_record`
    checks one record; None when anything is off (the caller then reads the block line by line)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import json as pj

    raw = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(raw == 10)
    if not len(ends) or ends[-1] != len(raw) - 1:
        ends = np.append(ends, len(raw))
    starts = np.concatenate([[0], ends[:-1] + 1])
    size = ends - starts - (raw[np.maximum(ends - 1, 0)] == 13) * (ends > starts)  # without a CR before the LF
    blank = size <= 0
    if not block.isascii() and not _utf8(block):
        return None
    if (raw[starts[~blank]] != ord("{")).any():  # blanks around a record, or something else: line by line
        return None
    try:
        tab = pj.read_json(pa.py_buffer(block), read_options=pj.ReadOptions(block_size=2 * _PARSE_CHUNK),
                           parse_options=pj.ParseOptions(explicit_schema=_schema(), unexpected_field_behavior="infer"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    n = tab.num_rows
    lines = first + np.flatnonzero(~blank)
    if n != len(lines):
        return None
    if n == 0:
        return {"lengths": [], **{k: np.zeros(0) for k in ("lng", "lat", "state", "time_gap", "dist_gap", "dist",
                "time", "week_id", "time_id", "date_id", "segment")}, "driver": np.zeros(0, object),
                "trip_id": np.zeros(0, object), "zones": set()}
    lists = {}
    for k in DEEPTTE_LIST_KEYS:
        c = tab.column(k).combine_chunks()
        if c.null_count or c.values.null_count or c.offset:
            return None
        lists[k] = (np.asarray(c.offsets) - c.offsets[0].as_py(), c.flatten().to_numpy())
    off = lists["lngs"][0]
    if any(not np.array_equal(lists[k][0], off) for k in DEEPTTE_LIST_KEYS) or (np.diff(off) < 1).any():
        return None
    lng, lat, st, tg, dg = (lists[k][1] for k in DEEPTTE_LIST_KEYS)
    sc = {}
    for k in ("dist", "time", "weekID", "timeID", "dateID"):
        c = tab.column(k)
        if c.null_count:
            return None
        sc[k] = c.to_numpy()
    if not all(np.isfinite(a).all() for a in (lng, lat, st, tg, dg, sc["dist"], sc["time"])):
        return None
    head, last = off[:-1], off[1:] - 1
    inner = np.ones(len(tg), bool)
    inner[head] = False  # diff i-1 → i inside a trip
    dtg, ddg = np.diff(tg, prepend=0.0)[inner], np.diff(dg, prepend=0.0)[inner]
    if ((np.abs(lat) > 90.0).any() or (np.abs(lng) > 180.0).any() or (np.abs(tg[head]) > tol).any()
            or (np.abs(dg[head]) > DIST_GAP_TOLERANCE_KM).any() or (dtg < -_MONOTONE_SLACK).any()
            or (ddg < -_MONOTONE_SLACK).any() or (sc["dist"] < 0).any() or not (sc["time"] > 0).all()
            or (np.abs(sc["time"] - tg[last]) > tol).any()
            or not ((sc["weekID"] >= 0) & (sc["weekID"] <= 6)).all()
            or not ((sc["timeID"] >= 0) & (sc["timeID"] <= 1439)).all() or (sc["dateID"] < 0).any()):
        return None
    names = set(tab.column_names)
    drv = tab.column("driverID") if "driverID" in names else None
    if drv is None or drv.null_count or drv.type not in (pa.int64(), pa.string()):
        return None
    ids = np.char.add(id_prefix, lines.astype(str)).astype(object)
    if "tripID" in names:
        c = tab.column("tripID")
        if c.type not in (pa.int64(), pa.string(), pa.null()):
            return None
        if c.type == pa.string() and pc.any(pc.equal(c, "")).as_py():
            return None
        if c.null_count < n:
            given = pc.cast(c, pa.string()).to_numpy(zero_copy_only=False)
            has = ~pc.is_null(c).to_numpy(zero_copy_only=False)
            ids[has] = given[has]
    seg = np.zeros(n, np.int64)
    if "segment" in names:
        c = tab.column("segment")
        if c.type not in (pa.int64(), pa.null()):
            return None
        if c.null_count < n:
            v = pc.fill_null(c, 0).to_numpy()
            if (v < 0).any():
                return None
            seg = v
    zones = {DEEPTTE_TZ}
    if "tz" in names:
        c = tab.column("tz")
        if c.type not in (pa.string(), pa.null()):
            return None
        zones = {DEEPTTE_TZ} if c.null_count else set()
        for z in pc.unique(c.drop_null()).to_pylist():
            try:
                check_tz(z)
            except ValueError:
                return None
            zones.add(z)
    return {"lengths": np.diff(off), "lng": lng, "lat": lat, "state": st.astype(np.float32), "time_gap": tg,
            "dist_gap": dg, "dist": sc["dist"], "time": sc["time"],
            "driver": pc.cast(drv, pa.string()).to_numpy(zero_copy_only=False),
            "week_id": sc["weekID"], "time_id": sc["timeID"], "date_id": sc["dateID"], "trip_id": ids,
            "segment": seg, "zones": zones}


def _utf8(block: bytes) -> bool:
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
