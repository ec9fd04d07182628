"""The arithmetic of the CSR layout (:mod:`stfast.data.trips`): trip lengths to offsets, and the points of
chosen trips."""
from __future__ import annotations

import numpy as np


def lengths_to_offsets(lengths: np.ndarray) -> np.ndarray:
    """[T] int lengths → [T + 1] int64 offsets starting at 0."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _gather_points(offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point indices of trips ``idx`` (in that order) and the new offsets."""
    starts, ends = offsets[idx], offsets[idx + 1]
    lens = ends - starts
    new_off = lengths_to_offsets(lens)
    # position of every kept point: start of its trip + rank inside the trip
    pt = np.repeat(starts - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    return pt, new_off
