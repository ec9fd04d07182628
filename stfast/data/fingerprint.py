"""A fingerprint of preprocessed trips: what a checkpoint records of the data it was trained on.

Two loads give the same fingerprint exactly when they give the same trips (same points, labels,
drivers and calendar ids, in the same order), whatever file, format or path they came from, so a
``--resume`` on other data, or a split applied to data it was not drawn from, can be refused.
"""
from __future__ import annotations

import hashlib

import numpy as np

from .trips import Trips

#: the fields hashed (everything the model or a split reads)
FIELDS = ("offsets", "lng", "lat", "state", "time_gap", "dist_gap", "dist", "time", "week_id", "time_id", "date_id")


def trips_fingerprint(trips: Trips) -> str:
    """Hex BLAKE2b-128 digest of ``trips``' arrays (:data:`FIELDS` as little-endian float64 / int64) and
    driver ids. About 0.1 s per million points."""
    h = hashlib.blake2b(digest_size=16)
    for name in FIELDS:
        a = np.asarray(getattr(trips, name))
        a = a.astype("<i8" if np.issubdtype(a.dtype, np.integer) else "<f8", copy=False)
        h.update(name.encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update("\x1f".join(map(str, trips.driver)).encode())
    return h.hexdigest()
