"""Reader of point tables in Apache Parquet or Arrow IPC (Feather v2) files: the point CSV's columns.

Columns (matched by name after stripping blanks, case-insensitive; any order; extra columns ignored, and not
read)::

    trip_id, timestamp, lng, lat[, driver_id][, state]

``trip_id`` and ``driver_id`` may be strings or integers; ``timestamp`` a string (as in the point CSV:
ISO-8601, naive = UTC, or Unix seconds), a number (Unix seconds) or an Arrow timestamp (naive = UTC; with a
time zone, that zone is the trips' default for calendar ids); ``lng``/``lat`` WGS-84 degrees; ``state`` a
number. The rules and the result are those of :func:`~stfast.data.readers.csv_points.read_csv_points`: a table
holding exactly a point CSV's rows gives the same trajectories. A file, or a folder of them (``*.parquet``,
``*.arrow``, ``*.feather``, ``*.ipc`` at any depth, sorted by path), is read one row group (Parquet) or record
batch (Arrow) at a time, at most :data:`BATCH_ROWS` rows in memory, and streamed into a store by
:func:`stfast.data.convert.convert_to_store`. Errors name the file, the row group and the row (0-based, as
pyarrow counts them) and the column.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _BadField, _collect_points, _Problems, _require_file, _TripCodes
from stfast.data.trips import Trajectories
from stfast.data.tz import TZ_FROM_TIMESTAMPS

PARQUET_MAGIC = b"PAR1"
ARROW_MAGIC = b"ARROW1"
_STREAM_MAGIC = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message (continuation marker)
SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
BATCH_ROWS = 1 << 20
"""Rows read at a time within a row group."""
_BLANKS = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what str.strip removes in ASCII text, as the point CSV trims


def is_table_file(p: Path) -> bool:
    """True when ``p``'s first bytes are those of a Parquet or Arrow IPC (file or stream) file."""
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head.startswith(PARQUET_MAGIC) or head.startswith(ARROW_MAGIC) or head.startswith(_STREAM_MAGIC)


def table_files(p: Path) -> list[Path]:
    """The table files under folder ``p`` (suffixes :data:`SUFFIXES`, any depth), sorted by path."""
    return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES)


def read_parquet_points(path: str | os.PathLike, *, on_error: str = "raise") -> Trajectories:
    """Read a Parquet / Arrow IPC point table, or a folder of them (module doc), into
    :class:`~stfast.data.trips.Trajectories`, as :func:`~stfast.data.readers.csv_points.read_csv_points` reads
    the same rows from a CSV (same fields, dtypes and order; ``source`` is the file).

    Raises:
        TrajectoryFormatError: missing path, not a Parquet / Arrow file, no table file in a folder; a required
            column missing or named twice; a null or empty ``trip_id``; a bad timestamp; a null, non-finite or
            out-of-range ``lng``/``lat``; a non-finite ``state``; one trip with two ``driver_id`` values (the
            message names the row group and row; field = column name).
    """
    probs, codes, meta = _Problems(on_error), _TripCodes(), {}
    return _collect_points(path, iter_parquet_blocks(path, probs, codes, meta), probs, codes, meta)


def _batches(f: Path, names: dict) -> Iterator[tuple[str, int, object]]:
    """(where: "row group g" / "record batch g", first row within it, pyarrow RecordBatch of the columns read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(f, "rb") as fh:
        head = fh.read(8)
    try:
        if head.startswith(PARQUET_MAGIC):
            pf = pq.ParquetFile(f)
            for g in range(pf.num_row_groups):
                row = 0
                for b in pf.iter_batches(BATCH_ROWS, row_groups=[g], columns=list(names.values()), use_threads=True):
                    yield f"row group {g}", row, b
                    row += b.num_rows
            return
        reader = pa.ipc.open_file(f) if head.startswith(ARROW_MAGIC) else pa.ipc.open_stream(f)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) if head.startswith(ARROW_MAGIC) \
            else iter(reader)
        for g, b in enumerate(batches):
            b = b.select(list(names.values()))
            for row in range(0, max(b.num_rows, 1), BATCH_ROWS):
                yield f"record batch {g}", row, b.slice(row, BATCH_ROWS)
    except (pa.ArrowInvalid, OSError) as e:
        raise TrajectoryFormatError(f, None, None, f"cannot read as Parquet / Arrow: {e}") from None


def _schema_names(f: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(f, "rb") as fh:
        head = fh.read(8)
    try:
        if head.startswith(PARQUET_MAGIC):
            return list(pq.read_schema(f).names)
        if head.startswith(ARROW_MAGIC):
            return list(pa.ipc.open_file(f).schema.names)
        if head.startswith(_STREAM_MAGIC):
            return list(pa.ipc.open_stream(f).schema.names)
    except (pa.ArrowInvalid, OSError) as e:
        raise TrajectoryFormatError(f, None, None, f"cannot read as Parquet / Arrow: {e}") from None
    raise TrajectoryFormatError(f, None, None, "not a Parquet or Arrow IPC file (no PAR1 / ARROW1 magic)")


def _columns(f: Path) -> dict:
    """Column role → the column's name in ``f`` (required ones checked)."""
    from stfast.data.readers.csv_points import CSV_OPTIONAL, CSV_REQUIRED

    got: dict[str, str] = {}
    raw = _schema_names(f)
    for name in raw:
        k = name.strip().lower()
        if k in CSV_REQUIRED + CSV_OPTIONAL:
            if k in got:
                raise TrajectoryFormatError(f, None, k, f"column '{k}' named twice in the schema")
            got[k] = name
    for k in CSV_REQUIRED:
        if k not in got:
            raise TrajectoryFormatError(f, None, k, f"missing required column '{k}' (columns: {', '.join(raw)})")
    return got


def iter_parquet_blocks(path, probs: _Problems, codes: _TripCodes, meta: dict) -> Iterator[dict]:
    """The points of a Parquet / Arrow point table (or folder) batch by batch, as
    :func:`~stfast.data.readers.csv_points.iter_csv_blocks` gives a CSV's: dicts of ``code`` [n] int64, ``t``,
    ``off``, ``lng``, ``lat`` [n] float64, ``state`` [n] float32; ``meta`` gets ``offsets`` and ``tz`` once
    exhausted. Raises as :func:`read_parquet_points`."""
    p = _require_file(path)
    if p.is_dir():
        files = table_files(p)
        if not files:
            raise TrajectoryFormatError(path, None, None, f"no {'/'.join(SUFFIXES)} file in the folder")
    else:
        files = [p]
    any_offset, zones = False, set()
    for f in files:
        names = _columns(f)
        for where, row0, b in _batches(f, names):
            got = _parse_batch(f, where, row0, b, names, probs, codes, zones)
            if len(got["t"]):
                any_offset = any_offset or bool(np.isfinite(got["off"]).any())
                yield got
    meta["offsets"] = any_offset
    zones.discard(None)
    meta["tz"] = TZ_FROM_TIMESTAMPS if any_offset else (zones.pop() if len(zones) == 1 else "UTC")


def _text(col, field: str):
    """(trimmed string array, bad [n] bool, reasons) of a string or integer column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if not (pa.types.is_integer(col.type) or pa.types.is_dictionary(col.type)):
            raise _BadField(field, f"column type {col.type} is neither text nor integer")
        col = pc.cast(col, pa.string())
    col = pc.utf8_trim(pc.cast(col, pa.string()), characters=_BLANKS)
    null = col.is_null().to_numpy(zero_copy_only=False)
    empty = pc.fill_null(pc.equal(pc.utf8_length(col), 0), False).to_numpy(zero_copy_only=False)
    return col, null, empty


def _numbers(col, field: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        v = pc.cast(col, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _BadField(field, f"column type {col.type} is not numeric") from None
    return v.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls → NaN


def _times(col, zones: set) -> tuple[np.ndarray, np.ndarray, list]:
    """(Unix seconds, UTC offsets or NaN, per-row reason or None for the rows the vectorized parse refused)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from stfast.data.readers.csv_points import _timestamps, parse_timestamp_offset

    n = len(col)
    off = np.full(n, np.nan)
    if pa.types.is_timestamp(col.type):
        zones.add(col.type.tz or "UTC")
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[col.type.unit]
        t = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / scale
        return t, off, [None if np.isfinite(v) else "null" for v in t] if np.isnan(t).any() else []
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        t = _numbers(col, "timestamp")
        return t, off, [None if np.isfinite(v) else f"not a finite number: {v!r}" for v in t] \
            if not np.isfinite(t).all() else []
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise _BadField("timestamp", f"column type {col.type} is neither text, a number nor a timestamp")
    col = pc.cast(col, pa.string())
    got = _timestamps(col) if n and not col.null_count else None
    if got is not None:
        return got[0], got[1], []
    t, why = np.full(n, np.nan), [None] * n
    for i, s in enumerate(col.to_pylist()):
        if s is None or not s.strip():
            why[i] = "null" if s is None else "empty"
            continue
        try:
            t[i], off[i] = parse_timestamp_offset(s)
        except _BadField as e:
            why[i] = e.reason
    return t, off, why


def _parse_batch(f: Path, where: str, row0: int, b, names: dict, probs: _Problems, codes: _TripCodes,
                 zones: set) -> dict:
    """One batch's points checked (bad rows raised or counted, naming row group and row) and coded."""
    import pyarrow as pa

    n = b.num_rows
    col = {k: b.column(b.schema.get_field_index(v)) for k, v in names.items()}
    try:
        trip, t_null, t_empty = _text(col["trip_id"], "trip_id")
        drv, d_null, _ = (_text(col["driver_id"], "driver_id") if "driver_id" in col
                          else (pa.array([""] * n, pa.string()), np.zeros(n, bool), None))
        t, off, t_why = _times(col["timestamp"], zones)
        x, y = _numbers(col["lng"], "lng"), _numbers(col["lat"], "lat")
        st = _numbers(col["state"], "state") if "state" in col else np.zeros(n)
    except _BadField as e:
        raise TrajectoryFormatError(f, None, e.field, e.reason, where) from None
    checks = [  # (bad rows, field, reason of row i)
        (t_null, "trip_id", lambda i: "null"), (t_empty, "trip_id", lambda i: "empty"),
        (d_null, "driver_id", lambda i: "null"),
        (np.array([w is not None for w in t_why], bool) if t_why else np.zeros(n, bool), "timestamp",
         lambda i: t_why[i]),
        (~np.isfinite(x), "lng", lambda i: "null" if col["lng"][i].as_py() is None else f"not a finite number: {x[i]!r}"),
        (~np.isfinite(y), "lat", lambda i: "null" if col["lat"][i].as_py() is None else f"not a finite number: {y[i]!r}"),
        (np.abs(np.nan_to_num(x)) > 180.0, "lng", lambda i: f"longitude {x[i]} outside [-180, 180]"),
        (np.abs(np.nan_to_num(y)) > 90.0, "lat", lambda i: f"latitude {y[i]} outside [-90, 90]"),
        (~np.isfinite(st), "state", lambda i: "null or not a finite number"),
    ]
    bad = np.zeros(n, bool)
    for m, _, _ in checks:
        bad |= m
    if bad.any():
        trips = trip.to_pylist()
        for i in np.flatnonzero(bad):
            m, field, why = next(c for c in checks if c[0][i])
            probs.bad(f, None, field, why(i), trip=trips[i] or None, at=f"{where}, row {row0 + i}")
        keep = pa.array(~bad)
        trip, drv = trip.filter(keep), drv.filter(keep)
        t, off, x, y, st = (a[~bad] for a in (t, off, x, y, st))
        rows = np.flatnonzero(~bad)
    else:
        rows = None
    code = codes.encode_block(trip, drv, str(f)) if len(t) else np.zeros(0, np.int64)
    if code is None:  # some trip has another driver than its first row: name the row
        ok, code = np.ones(len(t), bool), np.zeros(len(t), np.int64)
        for i, (tr, dr) in enumerate(zip(trip.to_pylist(), drv.to_pylist())):
            try:
                code[i] = codes.of_row(tr, dr, str(f), "trip {trip} has driver {was!r}, now {now!r}")
            except _BadField as e:
                ok[i] = False
                r = row0 + (i if rows is None else int(rows[i]))
                probs.bad(f, None, e.field, e.reason, trip=tr, at=f"{where}, row {r}")
        code, t, off, x, y, st = (a[ok] for a in (code, t, off, x, y, st))
    return {"code": code, "t": t, "off": off, "lng": x, "lat": y, "state": st.astype(np.float32)}
