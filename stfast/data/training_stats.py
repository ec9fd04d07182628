"""What is computed from a run's training split for the model's inputs: the normalization statistics
(:class:`NormStats`) and the driver vocabulary (:class:`DriverVocab`). numpy only, no torch: ``stfast data
convert`` derives them for the default run (:mod:`stfast.data.setup`) without loading the model's layers.

Statistics are computed on the training split only, for exactly the quantity they normalize (fault 4
of the original DeepTTE, see docs: its per-step gap statistics were applied to cumulative values).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .trip_view import iter_chunks
from .trips import Trips


def local_spans(trips: Trips, values: np.ndarray, k: int) -> np.ndarray:
    """Differences ``values[j + k - 1] - values[j]`` over every window of k points inside each trip.

    Args:
        trips: T trips, N points.
        values: [N] float64 cumulative per-point quantity (``time_gap`` in s or ``dist_gap`` in km).
        k: window (geo-conv kernel size).
    Returns:
        [Σ (L_i − k + 1)] float64, trip after trip.
    """
    lens = trips.lengths
    n_win = np.maximum(lens - k + 1, 0)
    starts = np.repeat(trips.offsets[:-1], n_win) + (
        np.arange(int(n_win.sum())) - np.repeat(np.cumsum(n_win) - n_win, n_win))
    return values[starts + k - 1] - values[starts]


class _Moments:
    """Mean and standard deviation of values added in pieces (Chan et al.'s pairwise update); one piece gives
    numpy's ``mean()`` and ``std()`` exactly."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, a) -> "_Moments":
        a = np.asarray(a, dtype=np.float64)
        if a.size == 0:
            return self
        m = float(a.mean())
        d = a - m
        m2, n = float(np.add.reduce(np.multiply(d, d, out=d))), self.n + a.size
        delta = m - self.mean
        self.mean = m if self.n == 0 else self.mean + delta * a.size / n
        self.m2 = m2 if self.n == 0 else self.m2 + m2 + delta * delta * self.n * a.size / n
        self.n = n
        return self

    def mean_std(self) -> tuple[float, float]:
        """(mean, standard deviation), the deviation 1.0 for fewer than 2 values or one below 1e-12."""
        s = float(np.sqrt(self.m2 / self.n)) if self.n > 1 else 1.0
        return self.mean, (s if s > 1e-12 else 1.0)


@dataclass
class NormStats:
    """Means and standard deviations used to normalize model inputs and outputs.

    Units: lng/lat in degrees, dist and local_dist in km, time and local_time in seconds.
    ``local_*`` describe k-point spans (what the geo-conv's local distance feature and the local
    estimator's target are), not per-step gaps.
    """

    lng_mean: float
    lng_std: float
    lat_mean: float
    lat_std: float
    dist_mean: float
    dist_std: float
    time_mean: float
    time_std: float
    local_dist_mean: float
    local_dist_std: float
    local_time_mean: float
    local_time_std: float
    speed_km_s: float  # Σ dist / Σ time over the trips: the constant-speed baseline's speed (km/s)
    kernel_size: int

    @classmethod
    def from_trips(cls, trips: Trips, kernel_size: int = 3) -> "NormStats":
        """Statistics of the (training) trips: Trips or a :class:`~stfast.data.trip_view.TripsView`, read in
        pieces of :data:`~stfast.data.trip_view.CHUNK_POINTS` points (memory stays bounded on a split of a store
        of any size; trips of one piece give numpy's ``mean``/``std`` exactly). Raises ValueError on an empty set."""
        if len(trips) == 0:
            raise ValueError("cannot compute normalization statistics of an empty training split")
        lng, lat, ld, lt = (_Moments() for _ in range(4))
        for part in iter_chunks(trips, point_fields=("lng", "lat", "dist_gap", "time_gap")):
            lng.add(part.lng)
            lat.add(part.lat)
            ld.add(local_spans(part, part.dist_gap, kernel_size))
            lt.add(local_spans(part, part.time_gap, kernel_size))
        dist, time = np.asarray(trips.dist, dtype=np.float64), np.asarray(trips.time, dtype=np.float64)
        dm, ds = _Moments().add(dist).mean_std()
        tm, ts = _Moments().add(time).mean_std()
        ldm, lds = ld.mean_std() if ld.n else (0.0, 1.0)
        ltm, lts = lt.mean_std() if lt.n else (0.0, 1.0)
        speed = float(np.sum(dist) / max(float(np.sum(time)), 1e-9))
        return cls(*lng.mean_std(), *lat.mean_std(), dm, ds, tm, ts, ldm, lds, ltm, lts, speed, int(kernel_size))

    @classmethod
    def of_split(cls, trips, kernel_size: int = 3) -> "NormStats":
        """:meth:`from_trips`, computed once per store and split and kept with the store
        (:mod:`stfast.data.derived`; other trips: computed)."""
        from .derived import cached_json

        return cls.from_dict(cached_json(trips, "norm_stats", {"kernel_size": int(kernel_size)},
                                         lambda: cls.from_trips(trips, kernel_size).to_dict()))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "NormStats":
        return cls(**d)


class DriverVocab:
    """Driver id (str) → embedding index. Index 0 is reserved for drivers unseen in training."""

    UNKNOWN = 0

    def __init__(self, drivers):
        uniq = sorted({str(d) for d in drivers})
        self.index = {d: i + 1 for i, d in enumerate(uniq)}

    def __len__(self) -> int:
        """Embedding rows needed: known drivers + the unknown index."""
        return len(self.index) + 1

    def encode(self, drivers) -> np.ndarray:
        """[T] object str → [T] int64 indices (0 for unknown drivers)."""
        return np.fromiter((self.index.get(str(d), self.UNKNOWN) for d in drivers), dtype=np.int64,
                           count=len(drivers))

    def to_list(self) -> list[str]:
        return sorted(self.index, key=self.index.get)

    @classmethod
    def of_split(cls, trips) -> "DriverVocab":
        """The vocabulary of ``trips``' drivers, computed once per store and split and kept with the store
        (:mod:`stfast.data.derived`; other trips: computed)."""
        from .derived import cached_json

        return cls.from_list(cached_json(trips, "drivers", {}, lambda: cls(trips.driver).to_list()))

    @classmethod
    def from_list(cls, drivers: list[str]) -> "DriverVocab":
        v = cls([])
        v.index = {d: i + 1 for i, d in enumerate(drivers)}
        return v
