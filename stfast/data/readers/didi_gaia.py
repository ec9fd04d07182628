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
from array import array

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.geo import gcj02_to_wgs84
from stfast.data.readers._common import _BadField, _finite, _lng_lat, _is_didi_data_file, _iter_lines, _Problems, _require_file
from stfast.data.trips import Trajectories, lengths_to_offsets

DIDI_TZ = "Asia/Shanghai"
"""Default time zone of DiDi GAIA data (Chengdu, Xi'an)."""

DIDI_FIELDS = ("driver_id", "order_id", "unix_ts", "lng", "lat")



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
    p = _require_file(path)
    if p.is_dir():
        files = sorted(c for c in p.iterdir() if _is_didi_data_file(c))
        if not files:
            raise TrajectoryFormatError(path, None, None, "directory holds no gps_* files")
    else:
        files = [p]

    lng, lat, t = array("d"), array("d"), array("d")
    code = array("q")
    orders: dict[str, int] = {}
    drivers: list[str] = []
    sources: list[str] = []
    empty = []
    for f in files:
        fs = str(f)
        n_before = probs.dropped.get("bad_line", 0) + len(code)
        for no, line in _iter_lines(f):
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
                c = orders.get(order)
                if c is None:
                    c = orders[order] = len(drivers)
                    drivers.append(drv)
                    sources.append(fs)
                elif drivers[c] != drv:
                    raise _BadField("driver_id", f"order {order} was driven by {drivers[c]}, now by {drv}")
            except _BadField as e:
                probs.bad(f, no, e.field, e.reason, trip=order)
                continue
            code.append(c)
            t.append(ts)
            lng.append(x)
            lat.append(y)
        if probs.dropped.get("bad_line", 0) + len(code) == n_before:
            empty.append(f)
    if empty:
        probs.count("empty_file", len(empty))
        logging.getLogger("stfast.data").warning("skipped %d empty gps file(s) (first: %s)", len(empty), empty[0])
    probs.warn(path)

    code_a = np.frombuffer(code, dtype=np.int64) if len(code) else np.zeros(0, np.int64)
    t_a = np.frombuffer(t, dtype=np.float64) if len(t) else np.zeros(0)
    order_idx = np.lexsort((t_a, code_a))  # by order, then time; stable
    lengths = np.bincount(code_a, minlength=len(drivers)).astype(np.int64)
    g_lng = np.frombuffer(lng, dtype=np.float64)[order_idx] if len(lng) else np.zeros(0)
    g_lat = np.frombuffer(lat, dtype=np.float64)[order_idx] if len(lat) else np.zeros(0)
    w_lng, w_lat = gcj02_to_wgs84(g_lng, g_lat)
    return Trajectories(
        offsets=lengths_to_offsets(lengths),
        lng=np.asarray(w_lng, dtype=np.float64),
        lat=np.asarray(w_lat, dtype=np.float64),
        t=t_a[order_idx].copy(),
        state=np.ones(len(t_a), dtype=np.float32),
        driver=np.array(drivers, dtype=object),
        source=np.array(sources, dtype=object),
        mode=None,
        trip_id=np.array(list(orders), dtype=object),
        dropped=dict(probs.dropped),
        dropped_trips=probs.dropped_trips(orders),
        tz=DIDI_TZ,
    )
