"""Sub-trajectory augmentation: more training trips from the ones a small data set has.

A contiguous piece of a recorded trip is itself a trip with a known travel time: its points, its time and
distance gaps rebased to its first point, its departure time shifted by the time the full trip took to get
there. Adding such pieces to the training split gives the model more (distance, departure time, route) →
travel time examples without any new data; the validation and test trips stay whole.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .trips import Trips, lengths_to_offsets

MIN_SUBTRIP_POINTS = 3  # DeepTTE's minimum trip (preprocess.PreprocessConfig.min_points) and geo-conv kernel


def add_subtrips(trips: Trips, n: int, seed: int, min_fraction: float = 0.5) -> Trips:
    """``trips`` followed by :func:`subtrips` of them (draw 0). Raises ValueError as :func:`subtrips`."""
    pieces = subtrips(trips, n, seed, min_fraction)
    return Trips.concat([trips, pieces]) if len(pieces) else trips  # they agree on tz and preprocess_config


def subtrips(trips: Trips, n: int, seed: int, min_fraction: float = 0.5, draw: int = 0) -> Trips:
    """``n`` random sub-trajectories of each of ``trips`` (the pieces alone).

    Each piece keeps a contiguous run of ``m`` of the trip's ``L`` points, ``m`` uniform in
    [max(⌈min_fraction·L⌉, 3), L − 1] and its start uniform; trips of fewer than 4 points give none, and a
    piece with no travel time or distance (a stop) is left out. A piece's fields: the points' ``lng``, ``lat``,
    ``state``; ``time_gap`` and ``dist_gap`` minus the piece's first value; ``time`` (s) and ``dist`` (km) its
    span of those (``dist`` scaled by the trip's ``dist / dist_gap[-1]``, so that it is measured as the trip's
    was); ``time_id`` (minute of day) advanced by the whole minutes of the time before the piece, ``week_id``
    and ``date_id`` by the days that crosses; ``driver`` the trip's; ``trip_id`` the trip's with ``~sub<j>``.

    Args:
        trips: T trips, N points (a training split).
        n: pieces per trip, ≥ 0 (0: none).
        seed: seed of the pieces (numpy Generator).
        min_fraction: the shortest piece, as a fraction of the trip's points, in (0, 1).
        draw: which independent set of pieces for this ``seed`` (≥ 0).
    Returns:
        Trips: up to n·T pieces (trip-major: all pieces of trip 0 first), metadata of ``trips``.
    Raises:
        ValueError: n < 0, draw < 0 or min_fraction outside (0, 1).
    """
    if n < 0 or int(n) != n:
        raise ValueError(f"sub-trips per trip must be an integer >= 0, not {n}")
    if not 0.0 < min_fraction < 1.0:
        raise ValueError(f"min_fraction must be in (0, 1), not {min_fraction}")
    if draw < 0 or int(draw) != draw:
        raise ValueError(f"draw must be an integer >= 0, not {draw}")
    if n == 0 or len(trips) == 0:
        return trips.subset(np.zeros(0, dtype=np.int64))
    base, rows = trips.locate(np.arange(len(trips)))
    sp = subtrip_spans(trips, n, seed, min_fraction, draw)
    parent, first, m = sp["parent"], sp["first"], sp["m"]
    off = lengths_to_offsets(m)
    pt = np.repeat(first - off[:-1], m) + np.arange(off[-1], dtype=np.int64)
    f = _piece_fields(base, rows[parent], first, m)
    j = sp["k"]
    return Trips(
        offsets=off, lng=base.lng[pt], lat=base.lat[pt], state=base.state[pt],
        time_gap=base.time_gap[pt] - np.repeat(f["t0"], m), dist_gap=base.dist_gap[pt] - np.repeat(f["d0"], m),
        dist=f["dist"], time=f["time"], driver=trips.driver[parent], week_id=f["week_id"], time_id=f["time_id"],
        date_id=f["date_id"], trip_id=np.array([f"{t}~sub{k}" for t, k in zip(trips.trip_id[parent], j)], dtype=object),
        segment=trips.segment[parent], tz=trips.tz, preprocess_config=trips.preprocess_config)


def subtrip_spans(trips, n: int, seed: int, min_fraction: float = 0.5, draw: int = 0) -> dict:
    """The pieces :func:`subtrips` makes, as index arrays only (no point is copied): ``parent`` [P] int64 (the
    trip of ``trips`` each is cut from), ``first`` [P] int64 (its first point in the arrays of ``trips``' base:
    the store's, for a view of one), ``m`` [P] int64 (its points), ``k`` [P] int64 (which of the trip's ``n``
    draws). Only the first and last point of each candidate piece are read. Raises as :func:`subtrips`."""
    base, rows = trips.locate(np.arange(len(trips)))
    # its own stream: the model's init and batch order stay as they were; draw 0 is the stream of before draws
    rng = np.random.default_rng([seed, 0x5AB] + ([draw] if draw else []))
    starts = np.asarray(base.offsets[rows])
    lens = np.asarray(base.offsets[rows + 1]) - starts
    parent = np.repeat(np.flatnonzero(lens >= MIN_SUBTRIP_POINTS + 1), n)
    length = lens[parent]
    lo = np.maximum(np.ceil(min_fraction * length).astype(np.int64), MIN_SUBTRIP_POINTS)
    lo = np.minimum(lo, length - 1)
    m = lo + (rng.random(len(parent)) * (length - lo)).astype(np.int64)  # in [lo, L − 1]
    start = (rng.random(len(parent)) * (length - m + 1)).astype(np.int64)  # in [0, L − m]
    first = starts[parent] + start
    last = first + m - 1
    keep = (base.time_gap[last] > base.time_gap[first]) & (base.dist_gap[last] > base.dist_gap[first])
    k = np.arange(len(keep))[keep] % n if n else np.zeros(0, np.int64)
    return {"parent": parent[keep], "first": first[keep], "m": m[keep], "k": k}


def kept_subtrip_spans(trips, n: int, seed: int, draw: int = 0, min_fraction: float = 0.5) -> dict:
    """:func:`subtrip_spans`, computed once per store, split and settings and kept with the store (read
    memory-mapped: the ranks share them; :mod:`stfast.data.derived`); other trips: computed."""
    from .derived import cached_arrays

    return cached_arrays(trips, "subtrips", {"n": int(n), "seed": int(seed), "draw": int(draw),
                                             "min_fraction": float(min_fraction)},
                         lambda: subtrip_spans(trips, n, seed, min_fraction, draw))


def _piece_fields(base, trip: np.ndarray, first: np.ndarray, m: np.ndarray) -> dict:
    """The per-piece fields of pieces (``first``, ``m``) of ``base``'s trips ``trip``: ``t0``, ``d0`` (the
    cumulative time and distance at the first point, subtracted from the piece's), ``time``, ``dist``,
    ``week_id``, ``time_id``, ``date_id`` (see :func:`subtrips`)."""
    last = first + m - 1
    t0, d0 = np.asarray(base.time_gap[first]), np.asarray(base.dist_gap[first])
    time = np.asarray(base.time_gap[last]) - t0
    span_km = np.asarray(base.dist_gap[last]) - d0
    trip_end_km = np.asarray(base.dist_gap[np.asarray(base.offsets[trip + 1]) - 1])
    dist_t = np.asarray(base.dist[trip])
    scale = np.divide(dist_t, trip_end_km, out=np.ones(len(trip)), where=trip_end_km > 0)
    minutes = np.asarray(base.time_id[trip]) + (t0 // 60).astype(np.int64)
    days = minutes // 1440
    return {"t0": t0, "d0": d0, "time": time, "dist": span_km * scale, "week_id": (base.week_id[trip] + days) % 7,
            "time_id": minutes % 1440, "date_id": base.date_id[trip] + days}


class WithSubtrips:
    """The trips of a (training) split followed by pieces of them given as spans (:func:`subtrip_spans`, one set
    or several), for :class:`~stfast.data.dataset.TripDataset`: nothing is copied, a batch reads only its own
    points (from the base's memory-mapped columns for a split of a store), so every rank of a run holds index
    arrays, not a copy of the split and its pieces. Trip ``i < len(trips)`` is ``trips``' trip ``i``; then the
    pieces, set after set, exactly as :func:`subtrips` (and ``Trips.concat``) would lay them out."""

    def __init__(self, trips, span_sets: list[dict]):
        self.trips = trips
        self.base, self.rows = trips.locate(np.arange(len(trips)))
        def cat(k):  # one set (--subtrips-resample once): its arrays as read, memory-mapped from a store
            if len(span_sets) == 1:
                return span_sets[0][k]
            return np.concatenate([np.asarray(s[k]) for s in span_sets]) if span_sets else np.zeros(0, np.int64)

        self.parent, self.first, self.m = cat("parent"), cat("first"), cat("m")
        self.tz, self.preprocess_config = trips.tz, trips.preprocess_config

    def __len__(self) -> int:
        return len(self.trips) + len(self.m)

    @cached_property
    def lengths(self) -> np.ndarray:
        """[len(self)] int64 points per trip (made once: a step reads it)."""
        return np.concatenate([self.trips.lengths, self.m])

    def spans(self, idx) -> tuple:
        """(base Trips, first point [B], points [B], trip fields dict of [B] arrays incl. ``t0``/``d0`` and the
        base trip ``trip``) of trips ``idx`` of this sequence."""
        idx = np.asarray(idx, dtype=np.int64)
        n = len(self.trips)
        whole = idx < n
        trip = np.where(whole, self.rows[np.where(whole, idx, 0)], self.rows[self.parent[np.where(whole, 0, idx - n)]]
                        if len(self.parent) else 0)
        piece = np.where(whole, 0, idx - n)
        b = self.base
        first = np.where(whole, np.asarray(b.offsets[trip]), self.first[piece] if len(self.first) else 0)
        m = np.where(whole, np.asarray(b.offsets[trip + 1]) - np.asarray(b.offsets[trip]),
                     self.m[piece] if len(self.m) else 0)
        f = {"t0": np.zeros(len(idx)), "d0": np.zeros(len(idx)), "time": np.asarray(b.time[trip], np.float64),
             "dist": np.asarray(b.dist[trip], np.float64), "week_id": np.asarray(b.week_id[trip]),
             "time_id": np.asarray(b.time_id[trip])}
        if (~whole).any():
            p = _piece_fields(b, trip[~whole], first[~whole], m[~whole])
            for k in f:
                f[k][~whole] = p[k]
        f["trip"] = trip
        return b, first, m, f
