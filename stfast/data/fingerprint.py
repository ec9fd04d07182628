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


CHUNK = 1 << 20  # values hashed at a time: memory stays flat on a memory-mapped store of any size


def trips_fingerprint(trips: Trips) -> str:
    """Hex BLAKE2b-128 digest of ``trips``' arrays (:data:`FIELDS` as little-endian float64 / int64) and
    driver ids. About 0.1 s per million points; ``trips.fingerprint`` instead when set (a trips store records
    the digest at conversion, :mod:`stfast.data.store`)."""
    if getattr(trips, "fingerprint", None):
        return trips.fingerprint
    return compute_fingerprint(trips)


def compute_fingerprint(trips: Trips) -> str:
    """The digest of :func:`trips_fingerprint`, always hashed (in slices of :data:`CHUNK` values)."""
    h = hashlib.blake2b(digest_size=16)
    for name in FIELDS:
        a = np.asarray(getattr(trips, name))
        dt = "<i8" if np.issubdtype(a.dtype, np.integer) else "<f8"
        h.update(name.encode())
        for s in range(0, len(a), CHUNK):
            h.update(np.ascontiguousarray(a[s:s + CHUNK].astype(dt, copy=False)).data)
    d = trips.driver
    for s in range(0, len(d), CHUNK):  # one "\x1f"-joined text, hashed in pieces
        h.update((("\x1f" if s else "") + "\x1f".join(map(str, d[s:s + CHUNK]))).encode())
    return h.hexdigest()
