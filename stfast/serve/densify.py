"""Densify many routes at once: :func:`stfast.data.routes.densify`'s points, in one pass over all of them.

``routes.densify`` resamples one route by the training run's sequential rule (:func:`stfast.data.resample.
resample_mask`); the service densifies the routes of the requests being built together in one call, so their
interpolation is one set of numpy calls instead of one per route. The interpolation is the same arithmetic, element for element,
so the points equal ``routes.densify``'s exactly (``tests/test_serve_safety.py`` checks it).
"""
from __future__ import annotations

import numpy as np

from ..data.geo import haversine_km
from ..data.resample import resample_mask  # the training run's resampling rule, as routes.densify applies it
from ..data.routes import DENSIFY_STEPS


def densify_many(routes: list[np.ndarray], states: list[np.ndarray | None], spacing_km: float) -> list[tuple]:
    """Each route [n_i, 2] (lng, lat) degrees, n_i ≥ 2, with its states [n_i] or None, densified to ``spacing_km``:
    a list of (lng [m_i], lat [m_i], state [m_i] or None), as :func:`stfast.data.routes.densify` gives them."""
    if not routes:
        return []
    n = np.array([len(r) for r in routes])
    pts = np.concatenate(routes)
    lng, lat = pts[:, 0], pts[:, 1]
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    # the segments of every route (n_i - 1 each): their start points' global indices
    seg_start = np.concatenate([s + np.arange(k - 1) for s, k in zip(start, n)])
    seg = haversine_km(lng[seg_start], lat[seg_start], lng[seg_start + 1], lat[seg_start + 1])
    steps = np.maximum(np.ceil(seg / (spacing_km / DENSIFY_STEPS)).astype(np.int64), 1)
    src = np.repeat(seg_start, steps)
    frac = (np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)) / np.repeat(steps, steps)
    ilng = lng[src] + frac * (lng[src + 1] - lng[src])
    ilat = lat[src] + frac * (lat[src + 1] - lat[src])
    # each route's interpolated points, then its last point
    per_route = np.add.reduceat(steps, np.concatenate([[0], np.cumsum(n - 1)[:-1]]))
    m = per_route + 1
    out_start = np.concatenate([[0], np.cumsum(m)[:-1]])
    last_slot = out_start + m - 1
    is_last = np.zeros(int(m.sum()), bool)
    is_last[last_slot] = True
    flng, flat = np.empty(len(is_last)), np.empty(len(is_last))
    flng[~is_last], flat[~is_last] = ilng, ilat
    last = start + n - 1
    flng[last_slot], flat[last_slot] = lng[last], lat[last]
    fsrc = np.empty(len(is_last), np.int64)
    fsrc[~is_last], fsrc[last_slot] = src, last
    gid = np.repeat(np.arange(len(routes)), m)
    keep = resample_mask(flng, flat, gid, spacing_km)
    out = []
    for i, st in enumerate(states):
        sl = slice(out_start[i], out_start[i] + m[i])
        k = keep[sl]
        s = None if st is None else np.asarray(st)[fsrc[sl][k] - start[i]]
        out.append((flng[sl][k], flat[sl][k], s))
    return out
