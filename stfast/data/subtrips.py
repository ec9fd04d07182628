"""Sub-trajectory augmentation: more training trips from the ones a small data set has.

A contiguous piece of a recorded trip is itself a trip with a known travel time: its points, its time and
distance gaps rebased to its first point, its departure time shifted by the time the full trip took to get
there. Adding such pieces to the training split gives the model more (distance, departure time, route) →
travel time examples without any new data; the validation and test trips stay whole.
"""
from __future__ import annotations

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
    # its own stream: the model's init and batch order stay as they were; draw 0 is the stream of before draws
    rng = np.random.default_rng([seed, 0x5AB] + ([draw] if draw else []))
    lens = trips.lengths
    parent = np.repeat(np.flatnonzero(lens >= MIN_SUBTRIP_POINTS + 1), n)
    length = lens[parent]
    lo = np.maximum(np.ceil(min_fraction * length).astype(np.int64), MIN_SUBTRIP_POINTS)
    lo = np.minimum(lo, length - 1)
    m = lo + (rng.random(len(parent)) * (length - lo)).astype(np.int64)  # in [lo, L − 1]
    start = (rng.random(len(parent)) * (length - m + 1)).astype(np.int64)  # in [0, L − m]
    first = trips.offsets[parent] + start
    last = first + m - 1
    time = trips.time_gap[last] - trips.time_gap[first]
    span_km = trips.dist_gap[last] - trips.dist_gap[first]
    keep = (time > 0) & (span_km > 0)
    parent, m, first, time, span_km = parent[keep], m[keep], first[keep], time[keep], span_km[keep]
    off = lengths_to_offsets(m)
    pt = np.repeat(first - off[:-1], m) + np.arange(off[-1], dtype=np.int64)
    trip_end_km = trips.dist_gap[trips.offsets[parent + 1] - 1]
    scale = np.divide(trips.dist[parent], trip_end_km, out=np.ones(len(parent)), where=trip_end_km > 0)
    minutes = trips.time_id[parent] + (trips.time_gap[first] // 60).astype(np.int64)
    days = minutes // 1440
    j = np.arange(len(keep))[keep] % n
    pieces = Trips(
        offsets=off, lng=trips.lng[pt], lat=trips.lat[pt], state=trips.state[pt],
        time_gap=trips.time_gap[pt] - np.repeat(trips.time_gap[first], m),
        dist_gap=trips.dist_gap[pt] - np.repeat(trips.dist_gap[first], m),
        dist=span_km * scale, time=time, driver=trips.driver[parent],
        week_id=(trips.week_id[parent] + days) % 7, time_id=minutes % 1440, date_id=trips.date_id[parent] + days,
        trip_id=np.array([f"{t}~sub{k}" for t, k in zip(trips.trip_id[parent], j)], dtype=object),
        segment=trips.segment[parent], tz=trips.tz, preprocess_config=trips.preprocess_config)
    return pieces
