"""Generic point-CSV reader: one GPS point per row, a header naming the columns.

Header (columns in any order, matched by name after stripping blanks, case-insensitive; extra
columns ignored)::

    trip_id,timestamp,lng,lat[,driver_id][,state]

``timestamp`` is ISO-8601 (``2016-11-01T07:10:00+08:00``, ``2016-11-01 07:10:00Z``; naive = UTC)
or Unix seconds (a number). The UTC offset an ISO timestamp carries is kept per point
(``utc_offset_s``): by default preprocessing takes local time from it (UTC where a timestamp has
none), see :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`. ``lng``/``lat`` are WGS-84 degrees. Read with the stdlib :mod:`csv`
module's rules (RFC 4180 quoting; UTF-8, an initial BOM is ignored): blocks of rows are parsed by pyarrow's
CSV reader, and a block where anything is amiss is read again with :mod:`csv`, row by row, to name the bad
row (a quoted field may span lines only within one block of :data:`~stfast.data.readers._common.BLOCK_BYTES`).
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import itertools
import logging
import math
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import (_PARSE_CHUNK, _BadField, _finite, _iter_blocks, _lng_lat, _Problems, shown,
                                         _read_ahead, _require_file, _TripCodes)
from stfast.data.readers.columns import current as current_columns
from stfast.data.readers.columns import positions
from stfast.data.trips import Trajectories, lengths_to_offsets
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
    codes = _TripCodes()
    meta: dict = {}
    parts = list(iter_csv_blocks(path, probs, codes, meta))
    probs.warn(path)
    if not parts and not probs.dropped:
        logging.getLogger("stfast.data").warning("%s: header only, no points", path)

    def cat(k, dt):
        return np.concatenate([b[k] for b in parts]) if parts else np.zeros(0, dt)

    code_a, t_a = cat("code", np.int64), cat("t", np.float64)
    order = np.lexsort((t_a, code_a))
    lengths = np.bincount(code_a, minlength=len(codes)).astype(np.int64)
    return Trajectories(
        offsets=lengths_to_offsets(lengths),
        lng=cat("lng", np.float64)[order],
        lat=cat("lat", np.float64)[order],
        t=t_a[order],
        state=cat("state", np.float32)[order],
        driver=np.array(codes.driver, dtype=object),
        source=np.array([str(path)] * len(codes), dtype=object),
        mode=None,
        trip_id=np.array(list(codes.code), dtype=object),
        utc_offset_s=cat("off", np.float64)[order] if meta["offsets"] else None,
        dropped=dict(probs.dropped),
        dropped_trips=probs.dropped_trips(codes.code),
        tz=meta["tz"],
    )


class _Header:
    """The header row of a point CSV: column names and the positions of the columns read."""

    def __init__(self, path, no: int, row: list[str]):
        self.names = [c.strip().lower() for c in row]
        cmap = current_columns()
        if cmap is not None:  # --columns: the mapped columns take the point CSV's names, the others none
            pos = positions(path, no, row, cmap)
            self.names = [""] * len(row)
            for key, i in pos.items():
                self.names[i] = "timestamp" if key == "time" else key
        if not "".join(self.names).isascii():
            try:
                "".join(self.names).encode("utf-8")
            except UnicodeEncodeError:
                raise TrajectoryFormatError(path, no, None, "header is not valid UTF-8") from None
        idx: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name in idx and name in CSV_REQUIRED + CSV_OPTIONAL:
                raise TrajectoryFormatError(path, no, name, f"column '{name}' named twice in the header")
            idx.setdefault(name, i)
        for name in CSV_REQUIRED:
            if name not in idx:
                raise TrajectoryFormatError(
                    path, no, name, f"missing required column '{name}' (header: {shown(','.join(self.names))})")
        self.idx = idx
        self.i_trip, self.i_ts, self.i_lng, self.i_lat = (idx[k] for k in CSV_REQUIRED)
        self.i_drv, self.i_state = idx.get("driver_id"), idx.get("state")


def iter_csv_blocks(path, probs: _Problems, codes: _TripCodes, meta: dict) -> Iterator[dict]:
    """The points of the point CSV ``path`` block by block (see :func:`read_csv_points` for the rules): dicts
    of ``code`` [n] int64 (the trip's number in ``codes``, which gains new trips in order of first
    appearance), ``t`` [n] float64 Unix seconds UTC, ``off`` [n] float64 UTC offsets (NaN: none), ``lng``,
    ``lat`` [n] float64 degrees, ``state`` [n] float32. Bad rows are raised or counted by ``probs``. When
    exhausted, ``meta`` holds ``offsets`` (whether any timestamp carried an offset) and ``tz``
    (:data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS` if so, else "UTC").

    Raises:
        TrajectoryFormatError: as :func:`read_csv_points`.
    """
    p = _require_file(path)
    if p.is_dir():
        raise TrajectoryFormatError(path, None, None, "is a directory, expected a CSV file")
    header = None
    blocks = _whole_rows(_iter_blocks(p))
    for first, block in blocks:  # rows up to the header: read by the csv module
        if first == 1 and block.startswith(b"\xef\xbb\xbf"):
            block = block[3:]
        header, first, block = _find_header(p, first, block)
        if header is not None:
            break
    if header is None:
        raise TrajectoryFormatError(path, None, None, "empty file: no header row")
    any_offset = False
    rest = itertools.chain([(first, block)], blocks)
    for (first, block), parsed in _read_ahead(rest, lambda fb: _parse_block(fb[1], header)):
        got = None
        if parsed is not None:
            code = codes.encode_block(parsed.pop("trip"), parsed.pop("driver"), str(p))
            got = None if code is None else {"code": code, **parsed}
        if got is None:
            got = _slow_block(p, first, block, header, probs, codes)
        if len(got["t"]):
            any_offset = any_offset or bool(np.isfinite(got["off"]).any())
            yield got
    meta["offsets"] = any_offset
    meta["tz"] = TZ_FROM_TIMESTAMPS if any_offset else "UTC"


def _whole_rows(blocks: Iterator[tuple[int, bytearray]]) -> Iterator[tuple[int, bytearray]]:
    """The blocks of :func:`~stfast.data.readers._common._iter_blocks`, a block that ends inside a quoted field
    (an odd number of ``"``: a quoted field's quotes, doubled ones included, pair up) joined with the next, so
    that a quoted field holding a line break is never cut in two."""
    held = None
    for first, block in blocks:
        if held is not None:
            first, block = held[0], held[1] + block
        if b'"' in block and block.count(b'"') % 2:
            held = (first, block)
            continue
        held = None
        yield first, block
    if held is not None:
        yield held


def _rows(first: int, block: bytes):
    """csv.reader over a block's text (UTF-8, undecodable bytes kept as surrogates) and a function giving the
    1-based file line of the row just read."""
    reader = csv.reader(io.StringIO(block.decode("utf-8", errors="surrogateescape"), newline=""))
    return reader, lambda: first - 1 + reader.line_num


def _data_rows(path, first: int, block: bytes, probs: _Problems):
    """(1-based line, fields) of a block's non-blank rows read by the csv module; a CSV error is a bad line
    (raised or counted by ``probs``)."""
    reader, line = _rows(first, block)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            probs.bad(path, line(), None, f"CSV error: {e}")
            continue
        if row and any(c.strip() for c in row):
            yield line(), row


def _find_header(path: Path, first: int, block: bytes, limit: int | None = 1 << 20, make=None):
    """(header, first line after it, rest of the block) — header None when the block holds only blank rows.
    Only the block's first ``limit`` bytes are decoded unless the header is not in them. ``make(path, line,
    row)`` builds the header (default :class:`_Header`, the point CSV's)."""
    make = make or _Header
    head = block[:block.rfind(b"\n", 0, limit) + 1] if limit is not None and len(block) > limit else block
    reader, line = _rows(first, head or block)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            if 0 < len(head) < len(block):
                return _find_header(path, first, block, None, make)
            return None, first, b""
        except csv.Error as e:
            raise TrajectoryFormatError(path, line(), None, f"CSV error: {e}") from None
        if row and any(c.strip() for c in row):
            no = line()
            header = make(path, no, row)
            rest = block
            for _ in range(no - first + 1):  # the header's physical lines
                rest = rest[rest.index(b"\n") + 1:] if b"\n" in rest else b""
            return header, no + 1, rest


def _parse_block(block, h: _Header) -> dict | None:
    """A block's points parsed with pyarrow and checked with numpy: ``trip``/``driver`` (pyarrow string
    arrays), ``t``, ``off``, ``lng``, ``lat`` [n] float64, ``state`` [n] float32; None when anything is off (not
    ASCII, a lone CR, a parse error, an empty trip id, a value out of range or not finite, a timestamp the
    vectorized parse does not take). Touches no shared state (it runs in
    :func:`~stfast.data.readers._common._read_ahead`'s worker); the caller encodes the trips, which may still
    refuse the block (a trip with another driver)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    if not block.isascii() or (b"\r" in block and block.count(b"\r") != block.count(b"\r\n")):
        return None
    names = [f"c{i}" for i in range(len(h.names))]
    s, f64 = pa.string(), pa.float64()
    types = {names[h.i_trip]: s, names[h.i_ts]: s, names[h.i_lng]: f64, names[h.i_lat]: f64}
    if h.i_drv is not None:
        types[names[h.i_drv]] = s
    if h.i_state is not None:
        types[names[h.i_state]] = f64
    try:
        tab = pacsv.read_csv(
            pa.py_buffer(block), read_options=pacsv.ReadOptions(column_names=names, block_size=_PARSE_CHUNK),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(types),
                                                 strings_can_be_null=False, null_values=[],
                                                 quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    n = tab.num_rows
    if n == 0:
        return {"trip": pa.array([], s), "driver": pa.array([], s),
                **{k: np.zeros(0, np.float32 if k == "state" else np.float64) for k in ("t", "off", "lng", "lat", "state")}}
    blanks = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what str.strip removes in ASCII text
    has_blanks = any(c.encode() in block for c in blanks if c not in "\n\r")

    def text(i):
        c = tab.column(names[i]).combine_chunks()
        return pc.utf8_trim(c, characters=blanks) if has_blanks else c

    trip = text(h.i_trip)
    drv = text(h.i_drv) if h.i_drv is not None else pa.array([""], s).take(pa.array(np.zeros(n, np.int64)))
    x, y = tab.column(names[h.i_lng]).to_numpy(), tab.column(names[h.i_lat]).to_numpy()
    st = tab.column(names[h.i_state]).to_numpy() if h.i_state is not None else np.zeros(n)
    ts = _timestamps(tab.column(names[h.i_ts]).combine_chunks(), has_blanks)
    if (ts is None or pc.min(pc.utf8_length(trip)).as_py() == 0
            or not (np.isfinite(x).all() and np.isfinite(y).all() and np.isfinite(st).all())
            or np.abs(x).max() > 180.0 or np.abs(y).max() > 90.0):
        return None
    return {"trip": trip, "driver": drv, "t": ts[0], "off": ts[1], "lng": x, "lat": y, "state": st.astype(np.float32)}


# ISO-8601 forms the vectorized parse takes (others, and any value it cannot check, go to the csv module):
# date, T or blank, time with optional fraction, optional Z or ±HH:MM
_ISO = (r"^(?P<dt>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})(?P<frac>\.\d{1,6})?"
        r"(?P<z>[Zz]|[+-]\d{2}:\d{2})?$")


def _timestamps(col, has_blanks: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """(Unix seconds, UTC offsets in seconds or NaN) [n] float64 of a string column of timestamps, as
    :func:`parse_timestamp_offset` gives them; None when some value is not of a form parsed here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = pc.utf8_trim_whitespace(col) if has_blanks else col
    try:
        float(col[0].as_py())
        v = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    else:
        return (v, np.full(len(v), np.nan)) if np.isfinite(v).all() else None
    if pc.min_max(pc.utf8_length(col)).as_py() == {"min": 25, "max": 25}:  # the common form: ...T07:10:00+08:00
        got = _fixed_width_iso(col)
        if got is not None:
            return got
    m = pc.extract_regex(col, _ISO)
    if m.null_count:
        return None
    dt = pc.replace_substring(m.field("dt"), " ", "T")
    hh = pc.cast(pc.utf8_slice_codeunits(dt, 11, 13), pa.int64()).to_numpy()
    ss = pc.cast(pc.utf8_slice_codeunits(dt, 17, 19), pa.int64()).to_numpy()
    if hh.max() > 23 or ss.max() > 59:  # fromisoformat refuses 24:00 and leap seconds
        return None
    try:
        wall = pc.cast(pc.cast(dt, pa.timestamp("s")), pa.int64()).to_numpy().astype(np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    frac = m.field("frac")
    if frac.null_count < len(frac):  # microseconds, as datetime keeps them: (s·10⁶ + µs) / 10⁶
        us = pc.cast(pc.utf8_rpad(pc.utf8_slice_codeunits(pc.fill_null(frac, ".0"), 1, 7), 6, "0"), pa.int64())
        wall = (wall * 1e6 + us.to_numpy()) / 1e6
    z = m.field("z")
    off = np.full(len(col), np.nan)
    if z.null_count < len(z):
        zs = pc.fill_null(z, "")
        has = pc.greater(pc.utf8_length(zs), 1).to_numpy(zero_copy_only=False)
        off[pc.is_in(zs, pa.array(["Z", "z"])).to_numpy(zero_copy_only=False)] = 0.0
        if has.any():
            hz = pc.cast(pc.utf8_slice_codeunits(pc.fill_null(pc.if_else(has, zs, "+00:00"), ""), 1, 3), pa.int64()).to_numpy()
            mz = pc.cast(pc.utf8_slice_codeunits(pc.if_else(has, zs, "+00:00"), 4, 6), pa.int64()).to_numpy()
            if hz.max() > 23 or mz.max() > 59:
                return None
            sign = np.where(pc.starts_with(pc.if_else(has, zs, "+"), "-").to_numpy(zero_copy_only=False), -1.0, 1.0)
            off[has] = (sign * (hz * 3600.0 + mz * 60.0))[has]
    t = np.where(np.isnan(off), wall, wall - np.nan_to_num(off))
    return t, off


def _fixed_width_iso(col) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_timestamps` of a column whose values all have 25 characters, read as a [n, 25] byte matrix
    (no copy) and checked digit by digit: ``YYYY-MM-DD?HH:MM:SS±HH:MM`` (``?``: T or blank) with the ranges
    fromisoformat enforces; None when some value is not of that form."""
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], np.int32, count=n + 1, offset=4 * col.offset)
    b = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[0] + 25 * n].reshape(n, 25)
    sep = {4: b"-", 7: b"-", 13: b":", 16: b":", 22: b":"}
    if (not all((b[:, i] == ord(c)).all() for i, c in sep.items())
            or not ((b[:, 10] == ord("T")) | (b[:, 10] == ord(" "))).all()
            or not ((b[:, 19] == ord("+")) | (b[:, 19] == ord("-"))).all()):
        return None
    pos = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23, 24]
    d = b[:, pos].astype(np.int64) - ord("0")
    if d.min() < 0 or d.max() > 9:
        return None
    y = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
    mo, day, hh, mi, ss, hz, mz = (d[:, k] * 10 + d[:, k + 1] for k in range(4, 18, 2))
    leap = (y % 4 == 0) & ((y % 100 != 0) | (y % 400 == 0))
    dim = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(mo - 1, 0, 11)] + (leap & (mo == 2))
    if (y.min() < 1 or mo.min() < 1 or mo.max() > 12 or day.min() < 1 or (day > dim).any() or hh.max() > 23
            or mi.max() > 59 or ss.max() > 59 or hz.max() > 23 or mz.max() > 59):
        return None
    # days since 1970-01-01 of the civil date (H. Hinnant's days_from_civil)
    yy = y - (mo <= 2)
    era = yy // 400
    yoe = yy - era * 400
    doy = (153 * (mo + np.where(mo > 2, -3, 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    off = np.where(b[:, 19] == ord("-"), -1.0, 1.0) * (hz * 3600.0 + mz * 60.0)
    wall = (days * 86400 + hh * 3600 + mi * 60 + ss).astype(np.float64)
    return wall - off, off


def _slow_block(path: Path, first: int, block: bytes, h: _Header, probs: _Problems, codes: _TripCodes) -> dict:
    """A block's rows read by the csv module, checked one by one (the exact checks and messages)."""
    rows = []  # (code, t, offset, lng, lat, state)
    n_fields = len(h.names)
    for no, row in _data_rows(path, first, block, probs):
        trip = None
        try:
            if len(row) != n_fields:
                raise _BadField(None, f"expected {n_fields} fields as in the header, got {len(row)}")
            joined = "".join(row)
            if not joined.isascii():
                try:
                    joined.encode("utf-8")
                except UnicodeEncodeError:
                    raise _BadField(None, "row is not valid UTF-8 text") from None
            trip = row[h.i_trip].strip()
            if not trip:
                raise _BadField("trip_id", "empty")
            ts, off = parse_timestamp_offset(row[h.i_ts])
            x, y = _lng_lat(row[h.i_lng], row[h.i_lat])
            s = _finite(row[h.i_state], "state") if h.i_state is not None else 0.0
            drv = row[h.i_drv].strip() if h.i_drv is not None else ""
            rows.append((codes.of_row(trip, drv, str(path), "trip {trip} has driver {was!r}, now {now!r}"),
                         ts, off, x, y, s))
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason, trip=trip)
    c = np.array(rows, np.float64).reshape(-1, 6).T
    return {"code": c[0].astype(np.int64), "t": c[1], "off": c[2], "lng": c[3], "lat": c[4], "state": c[5].astype(np.float32)}
