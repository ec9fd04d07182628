"""Reader of Microsoft Research T-Drive taxi trajectories (Beijing, February 2008).

One text file per taxi (``<taxi id>.txt``), one GPS fix per line, no header::

    taxi_id,yyyy-mm-dd HH:MM:SS,longitude,latitude

Times are Beijing local time (:data:`TDRIVE_TZ`, converted to Unix seconds here). A file, or a folder of them
(every ``*.txt`` at any depth, in natural order of their names: 1.txt, 2.txt, ..., 10.txt), is read; empty
files (taxis without fixes) are skipped. Each taxi's fixes are one trajectory (sorted by time), which
preprocessing cuts into trips at time gaps longer than ``gap_s``, as it does GeoLife's
(:mod:`stfast.data.preprocess`). Blocks of lines are parsed by pyarrow; a block where anything is amiss is read
again line by line to name the bad line and field.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.readers._common import (_PARSE_CHUNK, _BadField, _block_lines, _collect_points, _iter_blocks,
                                         _lng_lat, _Problems, _read_ahead, _require_file, _TripCodes)
from stfast.data.trips import Trajectories

TDRIVE_TZ = "Asia/Shanghai"
TDRIVE_LINE = re.compile(r"\s*[^,\s]+\s*,\s*\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\s*,\s*-?[\d.]+\s*,\s*-?[\d.]+\s*")
"""A T-Drive line (what format detection looks for)."""
FIELDS = ("taxi_id", "time", "lng", "lat")


def tdrive_files(p: Path) -> list[Path]:
    """The ``*.txt`` files under folder ``p`` (any depth), in natural order of their relative paths."""
    def key(f: Path):
        return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", str(f.relative_to(p)))]

    return sorted((f for f in p.rglob("*.txt") if f.is_file()), key=key)


def read_tdrive(path: str | os.PathLike, *, on_error: str = "raise") -> Trajectories:
    """Read a T-Drive file or folder (module doc) into :class:`~stfast.data.trips.Trajectories`.

    Returns:
        One trajectory per taxi id, in order of first appearance: ``lng``, ``lat`` [N] float64 degrees; ``t``
        [N] float64 Unix seconds (local Beijing time converted); ``state`` [N] float32 zeros (not recorded);
        ``driver`` and ``trip_id`` [T] the taxi id; ``source`` [T] the file; ``tz`` Asia/Shanghai.

    Raises:
        TrajectoryFormatError: missing path; a line without 4 comma fields, an empty taxi_id, a time not
            ``yyyy-mm-dd HH:MM:SS``, a non-numeric or out-of-range lng / lat; one taxi id in two files
            (1-based line; field = taxi_id, time, lng or lat).
    """
    probs, codes, meta = _Problems(on_error), _TripCodes(), {}
    return _collect_points(path, iter_tdrive_blocks(path, probs, codes, meta), probs, codes, meta)


def iter_tdrive_blocks(path, probs: _Problems, codes: _TripCodes, meta: dict) -> Iterator[dict]:
    """The fixes of a T-Drive file or folder block by block: dicts of ``code`` [n] int64 (the taxi's number in
    ``codes``), ``t``, ``lng``, ``lat`` [n] float64, ``state`` [n] float32 zeros; ``meta`` gets ``tz`` and
    ``offsets`` (False). Raises as :func:`read_tdrive`."""
    p = _require_file(path)
    files = tdrive_files(p) if p.is_dir() else [p]
    meta.update(tz=TDRIVE_TZ, offsets=False)
    for f in files:
        for (first, block), parsed in _read_ahead(_iter_blocks(f), lambda fb: _parse_block(fb[1])):
            got = None
            if parsed is not None:
                code = codes.encode_block(parsed.pop("taxi"), parsed["driver"], str(f))
                parsed.pop("driver")
                if code is not None and _one_file_per_taxi(codes, code, str(f)):
                    got = {"code": code, **parsed}
            if got is None:
                got = _slow_block(f, first, block, probs, codes)
            if len(got["t"]):
                yield got


def _one_file_per_taxi(codes: _TripCodes, code: np.ndarray, source: str) -> bool:
    """True when every taxi of a block was first met in this file (else the slow path names the line)."""
    return all(codes.source[c] == source for c in np.unique(code))


def _parse_block(block) -> dict | None:
    """A block's fixes parsed with pyarrow: ``taxi``, ``driver`` (pyarrow string arrays), ``t``, ``lng``, ``lat``
    [n] float64, ``state`` [n] float32; None when anything is off. Touches no shared state."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    if not block.isascii() or b"\r" in block or b'"' in block or b" ," in block or b", " in block:
        return None
    try:
        tab = pacsv.read_csv(
            pa.py_buffer(block), read_options=pacsv.ReadOptions(column_names=list(FIELDS), block_size=_PARSE_CHUNK),
            convert_options=pacsv.ConvertOptions(
                column_types={"taxi_id": pa.string(), "time": pa.string(), "lng": pa.float64(), "lat": pa.float64()},
                strings_can_be_null=False, null_values=[], quoted_strings_can_be_null=False))
        n = tab.num_rows
        if n == 0:
            return {"taxi": pa.array([], pa.string()), "driver": pa.array([], pa.string()),
                    **{k: np.zeros(0) for k in ("t", "lng", "lat")}, "state": np.zeros(0, np.float32)}
        when = tab.column("time").combine_chunks()
        if pc.min_max(pc.utf8_length(when)).as_py() != {"min": 19, "max": 19}:
            return None
        wall = pc.strptime(when, format="%Y-%m-%d %H:%M:%S", unit="s")
        if not pc.all(pc.equal(pc.strftime(wall, "%Y-%m-%d %H:%M:%S"), when)).as_py():
            return None  # strptime rolls 02-30 over to 03-01: such a line is the slow path's to name
        t = pc.cast(pc.assume_timezone(wall, TDRIVE_TZ, ambiguous="earliest", nonexistent="earliest"),
                    pa.int64()).to_numpy().astype(np.float64)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    taxi = tab.column("taxi_id").combine_chunks()
    x, y = tab.column("lng").to_numpy(), tab.column("lat").to_numpy()
    if (pc.min(pc.utf8_length(taxi)).as_py() == 0 or not (np.isfinite(x).all() and np.isfinite(y).all())
            or np.abs(x).max() > 180.0 or np.abs(y).max() > 90.0):
        return None
    return {"taxi": taxi, "driver": taxi, "t": t, "lng": x, "lat": y, "state": np.zeros(n, np.float32)}


def _local_seconds(text: str) -> float:
    """Unix seconds of a ``yyyy-mm-dd HH:MM:SS`` Beijing wall time; _BadField("time") otherwise."""
    from zoneinfo import ZoneInfo

    try:
        d = _dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise _BadField("time", f"not yyyy-mm-dd HH:MM:SS: {text!r}") from None
    return d.replace(tzinfo=ZoneInfo(TDRIVE_TZ)).timestamp()


def _slow_block(path: Path, first: int, block: bytes, probs: _Problems, codes: _TripCodes) -> dict:
    """A block's lines checked one by one (the exact checks and messages)."""
    rows = []
    for no, text in _block_lines(first, block):
        taxi = None
        try:
            if text is None:
                raise _BadField(None, "line is not valid UTF-8 text")
            if not text.strip():
                continue
            f = text.split(",")
            if len(f) != 4:
                raise _BadField(None, f"expected 4 comma-separated fields (taxi_id,time,lng,lat), got {len(f)}")
            taxi = f[0].strip()
            if not taxi:
                raise _BadField("taxi_id", "empty")
            t = _local_seconds(f[1])
            x, y = _lng_lat(f[2], f[3])
            c = codes.code.get(taxi)
            if c is None:
                c = codes.add(taxi, taxi, str(path))
            elif codes.source[c] != str(path):
                raise _BadField("taxi_id", f"taxi {taxi} is also in {codes.source[c]}: one file per taxi")
            rows.append((c, t, x, y))
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason, trip=taxi)
    a = np.array(rows, np.float64).reshape(-1, 4).T
    return {"code": a[0].astype(np.int64), "t": a[1], "lng": a[2], "lat": a[3], "state": np.zeros(len(a[0]), np.float32)}


def first_line_is_tdrive(line: str | None) -> bool:
    return bool(line) and TDRIVE_LINE.fullmatch(line) is not None

