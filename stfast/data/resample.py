"""Minimum-spacing resampling of trajectories: step 5 of :func:`stfast.data.preprocess.preprocess`, also what
:mod:`stfast.data.routes` and the ETA service apply to a route.

Rule, per trip: its first and last point are kept; after a kept point k, the next kept point is the first
i > k at least ``s_km`` from k (great-circle distance, :func:`stfast.data.geo.haversine_km`); the scan stops
once a kept point is one of the trip's last two (the last one is kept anyway). This is DeepTTE's "we remove
points whose distance to the previous kept point is below a threshold" (Wang et al., AAAI 2018, §Experiments)
made exact for a sequence.

:func:`resample_mask` runs the scan in C++ (``stfast._prep``, csrc/prep/resample.h), one pass per trip;
:func:`resample_mask_reference` is the same rule in numpy, in rounds over all trips at once, the kernel's
reference in the tests. The two agree except where a distance lies within rounding of ``s_km`` (libm's and
numpy's sin and asin differ in the last bit).
"""
from __future__ import annotations

import numpy as np

from stfast.data.geo import haversine_km, path_km

try:
    from stfast._prep import resample_keep
except ImportError as e:  # a source tree not built in place, or a build against another Python
    from stfast._native import native_missing

    raise ImportError(native_missing("_prep", e)) from e


def _trip_bounds(trip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends [T] int64 of the runs of equal ``trip`` ids (a trip's points are consecutive)."""
    n = len(trip)
    first = np.ones(n, dtype=bool)
    first[1:] = trip[1:] != trip[:-1]
    starts = np.flatnonzero(first)
    return starts, np.append(starts[1:], n) if n else starts


def resample_mask(lng, lat, trip, s_km: float) -> np.ndarray:
    """Keep mask [n] bool of the rule in the module docstring.

    Args:
        lng, lat: [n] float64 degrees.
        trip: [n] integer trip id per point; a trip's points are consecutive (a new id, or a change of id,
            starts a trip).
        s_km: the minimum spacing, km, finite and > 0.

    Raises:
        ValueError: arrays not 1-D or of unequal lengths; ``s_km`` not a finite distance > 0.
    """
    lng, lat, trip = np.asarray(lng, np.float64), np.asarray(lat, np.float64), np.asarray(trip)
    if trip.ndim != 1 or len(trip) != len(lng):
        raise ValueError(f"trip must be 1-D with one id per point ({len(lng)}), got shape {trip.shape}")
    starts, ends = _trip_bounds(trip)
    return resample_keep(lng, lat, starts, ends, float(s_km))


def _next_far_point(lng, lat, lk, j, end, s_km) -> np.ndarray:
    """Per row: first index in [j, end) at least s_km from point lk, or -1 when there is none."""
    out = np.full(lk.shape, -1, dtype=np.int64)
    rows = np.arange(lk.size)
    width = 8
    while rows.size:
        idx = j[rows, None] + np.arange(width)[None, :]
        valid = idx < end[rows, None]
        idxc = np.where(valid, idx, lk[rows, None])
        d = haversine_km(lng[lk[rows], None], lat[lk[rows], None], lng[idxc], lat[idxc])
        hit = valid & (d >= s_km)
        found = hit.any(axis=1)
        out[rows[found]] = idx[found, hit[found].argmax(axis=1)]
        more = ~found & valid[:, -1]  # window lies fully inside the trip: scan further
        j = j.copy()
        j[rows[more]] += width
        rows = rows[more]
        width = min(width * 2, 256)
    return out


def resample_mask_reference(lng, lat, trip, s_km: float) -> np.ndarray:
    """:func:`resample_mask` in numpy (its reference): rounds over all trips at once, one kept point per trip
    and round. Path length bounds the haversine distance from above, so the search for the next kept point
    starts at the first point ``s_km`` of path away."""
    lng, lat = np.asarray(lng, np.float64), np.asarray(lat, np.float64)
    n = len(lng)
    keep = np.zeros(n, dtype=bool)
    if n == 0:
        return keep
    starts, ends = _trip_bounds(np.asarray(trip))
    keep[starts] = True
    keep[ends - 1] = True
    adj = np.zeros(n)
    adj[1:] = path_km(lng, lat)
    adj[starts] = 0.0
    cum = np.cumsum(adj)
    live = ends - starts > 2
    lk, end = starts[live], ends[live]
    while lk.size:
        target = cum[lk] + s_km * (1 - 1e-9) - 1e-12
        j = np.maximum(np.searchsorted(cum, target, side="left"), lk + 1)
        j = np.minimum(j, end)
        nxt = _next_far_point(lng, lat, lk, j, end, s_km)
        ok = nxt >= 0
        keep[nxt[ok]] = True
        alive = ok & (nxt < end - 2)  # the last point is kept anyway; stop one before it
        lk, end = nxt[alive], end[alive]
    return keep
