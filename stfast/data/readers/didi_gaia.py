"""DiDi GAIA (Chengdu / Xi'an, Oct–Nov 2016) raw GPS reader.

Format of a ``gps_YYYYMMDD`` file: no header, one point per line, 5 comma-separated fields::

    driver_id,order_id,unix_ts,lng,lat
    c3d30afbcb20703db48aa6faa0c67632,0aba894b24d2d74bdf06fc9585567680,1477955400,104.0817,30.65705

ids are 32-hex anonymised strings, ``unix_ts`` is Unix seconds, ``lng``/``lat`` are GCJ-02 degrees
(as used by DiDi's maps; converted to WGS-84 here with :func:`stfast.data.geo.gcj02_to_wgs84`).
Points are GPS fixes during paid orders, so every point is an occupied taxi (state 1).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.geo import gcj02_to_wgs84
from stfast.data.readers._common import (_PARSE_CHUNK, BLOCK_BYTES, _BadField, _block_lines, _finite,
                                         _is_didi_data_file, _iter_blocks, _lng_lat, _Problems, _read_ahead,
                                         _require_file, _TripCodes)
from stfast.data.trips import Trajectories, lengths_to_offsets

DIDI_TZ = "Asia/Shanghai"
"""Default time zone of DiDi GAIA data (Chengdu, Xi'an)."""

DIDI_FIELDS = ("driver_id", "order_id", "unix_ts", "lng", "lat")
# bytes on which the fast path could read a line otherwise than ``line.split(",")`` + ``str.strip`` +
# ``float`` do (blanks around a field; a lone CR): a block holding one is read line by line
_BLANKS = (b" ", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x1f")


def _plain(block: bytes) -> bool:
    """True when ``block`` is ASCII without blanks and every CR ends a line (each test a memchr-speed scan)."""
    return (block.isascii() and not any(b in block for b in _BLANKS)
            and (b"\r" not in block or block.count(b"\r") == block.count(b"\r\n")))



def read_didi_gaia(path: str | os.PathLike, *, on_error: str = "raise") -> Trajectories:
    """Read DiDi GAIA GPS points, one trajectory per order.

    Args:
        path: a ``gps_*`` file, or a directory whose ``gps_*`` files (no extension, or ``.csv`` /
            ``.txt``; so ``gps_*.sha256`` is not read) are all read, in name order. An order that
            spans files becomes one trajectory.
        on_error: ``"raise"`` or ``"skip"`` (skip bad rows, counted in ``dropped["bad_line"]``).

    Returns:
        :class:`~stfast.data.trips.Trajectories`, one trajectory per ``order_id`` in order of first
        appearance, its points sorted by time (stable: equal timestamps keep file order; duplicates
        are kept): ``lng``, ``lat`` [N] float64 WGS-84 degrees (converted from GCJ-02); ``t`` [N]
        float64 Unix seconds; ``state`` [N] float32 ones; ``driver`` [T] driver_id; ``trip_id`` [T]
        order_id; ``source`` [T] the file of the order's first row; ``mode`` None; ``tz``
        :data:`DIDI_TZ`. ``dropped`` counts rows skipped with ``on_error="skip"`` (``"bad_line"``) and
        files without rows (``"empty_file"``, with a warning); ``dropped_trips`` lists (reason
        "bad_line") the orders all of whose rows were skipped.

    Raises:
        TrajectoryFormatError: missing path, a directory without ``gps_*`` files, a row without 5
            fields, an empty id, a non-numeric or non-finite ``unix_ts``/``lng``/``lat``, lng outside
            [-180, 180] or lat outside [-90, 90], an order whose rows name different drivers (field
            names as in :data:`DIDI_FIELDS`, 1-based line numbers).
    """
    probs = _Problems(on_error)
    codes = _TripCodes()
    parts = list(iter_didi_blocks(path, probs, codes))
    probs.warn(path)

    def cat(k, dt):
        return np.concatenate([b[k] for b in parts]) if parts else np.zeros(0, dt)

    code_a, t_a = cat("code", np.int64), cat("t", np.float64)
    order_idx = np.lexsort((t_a, code_a))  # by order, then time; stable
    lengths = np.bincount(code_a, minlength=len(codes)).astype(np.int64)
    return Trajectories(
        offsets=lengths_to_offsets(lengths),
        lng=cat("lng", np.float64)[order_idx],
        lat=cat("lat", np.float64)[order_idx],
        t=t_a[order_idx],
        state=np.ones(len(t_a), dtype=np.float32),
        driver=np.array(codes.driver, dtype=object),
        source=np.array(codes.source, dtype=object),
        mode=None,
        trip_id=np.array(list(codes.code), dtype=object),
        dropped=dict(probs.dropped),
        dropped_trips=probs.dropped_trips(codes.code),
        tz=DIDI_TZ,
    )


def didi_files(path) -> list[Path]:
    """The ``gps_*`` files ``path`` names: itself, or a folder's, in name order. Raises TrajectoryFormatError
    (missing path, a folder without such files)."""
    p = _require_file(path)
    if not p.is_dir():
        return [p]
    files = sorted(c for c in p.iterdir() if _is_didi_data_file(c))
    if not files:
        raise TrajectoryFormatError(path, None, None, "directory holds no gps_* files")
    return files


def iter_didi_blocks(path, probs: _Problems, codes: _TripCodes) -> Iterator[dict]:
    """The points of ``path`` (a file or folder, as :func:`read_didi_gaia` reads it), block by block, in file
    order: dicts of ``code`` [n] int64 (the order's number in ``codes``, which gains the new orders), ``t``
    [n] float64 Unix seconds, ``lng``/``lat`` [n] float64 WGS-84 degrees. Bad rows are raised or counted by
    ``probs``; empty files counted (``"empty_file"``) with a warning. Each block is parsed by pyarrow's CSV
    reader and checked with numpy; a block where that finds anything amiss is read again line by line,
    which names the file, line and field of the bad row, as :func:`read_didi_gaia` documents."""
    empty = []
    for f in didi_files(path):
        n_rows = 0
        # two blocks parsed side by side (the datum shift and pyarrow's parse outweigh the trip codes and the
        # spill), of half the usual size: the same memory in flight as one full block
        blocks = _iter_blocks(f, BLOCK_BYTES // 2)
        for (first, block), parsed in _read_ahead(blocks, lambda fb: _parse_block(fb[1]), workers=2):
            got = None
            if parsed is not None:
                code = codes.encode_block(parsed.pop("order"), parsed.pop("driver"), str(f))
                if code is not None:
                    got = {"code": code, "t": parsed["t"], "lng": parsed["lng"], "lat": parsed["lat"]}
            if got is None:
                got = _slow_block(f, first, block, probs, codes)
            n_rows += len(got["t"]) + got.pop("bad", 0)
            if len(got["t"]):
                yield got
        if n_rows == 0:
            empty.append(f)
    if empty:
        probs.count("empty_file", len(empty))
        logging.getLogger("stfast.data").warning("skipped %d empty gps file(s) (first: %s)", len(empty), empty[0])


def _parse_block(block) -> dict | None:
    """A block's rows parsed with pyarrow and checked with numpy: ``order``/``driver`` (pyarrow string arrays),
    ``t``, ``lng``, ``lat`` [n] float64 (WGS-84: the datum shift is done here, in the worker, beside the caller's
    work on the previous block); None when anything is off (not ASCII, blanks
    around fields, a parse error, an empty id, a value out of range). Touches no shared state (it runs in
    :func:`~stfast.data.readers._common._read_ahead`'s worker); the caller encodes the trips, which may still
    refuse the block (an order with another driver)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    if not _plain(block):
        return None
    s = pa.string()
    try:
        tab = pacsv.read_csv(
            pa.py_buffer(block),
            read_options=pacsv.ReadOptions(column_names=list(DIDI_FIELDS), block_size=_PARSE_CHUNK),
            parse_options=pacsv.ParseOptions(quote_char=False, double_quote=False),
            convert_options=pacsv.ConvertOptions(
                column_types={"driver_id": s, "order_id": s, "unix_ts": pa.float64(), "lng": pa.float64(),
                              "lat": pa.float64()},
                strings_can_be_null=False, null_values=[], quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if tab.num_rows == 0:
        return {"order": pa.array([], s), "driver": pa.array([], s), "t": np.zeros(0), "lng": np.zeros(0),
                "lat": np.zeros(0)}
    drv, order = (tab.column(k).combine_chunks() for k in ("driver_id", "order_id"))
    t, x, y = (tab.column(k).to_numpy() for k in ("unix_ts", "lng", "lat"))
    if (pc.min(pc.utf8_length(drv)).as_py() == 0 or pc.min(pc.utf8_length(order)).as_py() == 0
            or not (np.isfinite(t).all() and np.isfinite(x).all() and np.isfinite(y).all())
            or np.abs(x).max() > 180.0 or np.abs(y).max() > 90.0):
        return None
    lng, lat = _to_wgs84(x, y)
    return {"order": order, "driver": drv, "t": t, "lng": lng, "lat": lat}


def _to_wgs84(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GCJ-02 → WGS-84 of a block's points, as every DiDi read does it (fast and line-by-line paths alike):
    :func:`~stfast.data.geo.gcj02_to_wgs84` with its offset in float32 and two refinements (float32's floor:
    within 0.15 mm of float64 around Chengdu, 1.8 mm anywhere in China; the inverse datum shift is the costliest
    step of reading DiDi, and float32's sin is vectorized)."""
    lng, lat = gcj02_to_wgs84(x, y, dtype=np.float32, iterations=2)
    return np.asarray(lng, np.float64), np.asarray(lat, np.float64)


def _slow_block(f: Path, first: int, block: bytes, probs: _Problems, codes: _TripCodes) -> dict:
    """A block read line by line (the exact checks and messages); ``bad``: its rows skipped."""
    fs = str(f)
    rows = []  # (code, unix_ts, lng, lat)
    bad0 = sum(probs.dropped.values())
    for no, line in _block_lines(first, block):
        if line is None:
            probs.bad(f, no, None, "line is not valid UTF-8 text")
            continue
        if not line.strip():
            continue
        parts = line.split(",")
        order = None
        try:
            if len(parts) != 5:
                raise _BadField(None, f"expected 5 comma-separated fields, got {len(parts)}")
            drv, order = parts[0].strip(), parts[1].strip()
            if not drv:
                raise _BadField("driver_id", "empty")
            if not order:
                raise _BadField("order_id", "empty")
            ts = _finite(parts[2], "unix_ts")
            x, y = _lng_lat(parts[3], parts[4])
            rows.append((codes.of_row(order, drv, fs, "order {trip} was driven by {was}, now by {now}"), ts, x, y))
        except _BadField as e:
            probs.bad(f, no, e.field, e.reason, trip=order)
    cols = np.array(rows, np.float64).reshape(-1, 4).T
    w_lng, w_lat = _to_wgs84(cols[2], cols[3])
    return {"code": cols[0].astype(np.int64), "t": cols[1], "lng": w_lng, "lat": w_lat,
            "bad": sum(probs.dropped.values()) - bad0}
