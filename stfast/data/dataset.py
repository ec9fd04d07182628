"""TripDataset: trips + normalization statistics + driver vocabulary → padded tensor batches.

Statistics are computed on the training split only, for exactly the quantity they normalize (fault 4
of the original DeepTTE, see docs: its per-step gap statistics were applied to cumulative values).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .trip_view import iter_chunks
from .trips import Trips, _gather_points, lengths_to_offsets


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


@dataclass
class TripBatch:
    """A batch of B trips padded to the longest, L points.

    Point tensors [B, L] (dtype = the batch dtype; zero past each trip's length): ``lng``, ``lat``
    (degrees), ``state`` (0/1), ``time_gap`` (s, cumulative), ``dist_gap`` (km, cumulative).
    Trip tensors [B]: ``lengths`` (int64 points), ``dist`` (km), ``time`` (s, the label),
    ``driver`` (int64 vocabulary index), ``week_id``, ``time_id`` (int64).
    ``host_lengths`` [B] int64: ``lengths`` on the CPU, always (default: a copy of ``lengths``, made
    once). :meth:`to` leaves it there, so that code reading lengths on the host (the ops size their
    launches from them, the model checks them) never waits for the device.
    """

    lng: torch.Tensor
    lat: torch.Tensor
    state: torch.Tensor
    time_gap: torch.Tensor
    dist_gap: torch.Tensor
    lengths: torch.Tensor
    dist: torch.Tensor
    time: torch.Tensor
    driver: torch.Tensor
    week_id: torch.Tensor
    time_id: torch.Tensor
    host_lengths: torch.Tensor | None = None

    def __post_init__(self):
        if self.host_lengths is None:
            self.host_lengths = self.lengths.to(device="cpu", dtype=torch.int64)
        elif self.host_lengths.device.type != "cpu":
            raise ValueError(f"TripBatch.host_lengths must be a CPU tensor, got one on {self.host_lengths.device}")

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def to(self, device) -> "TripBatch":
        """The batch with every tensor on ``device`` (non-blocking copies) except ``host_lengths``."""
        return TripBatch(**{k: v if k == "host_lengths" else v.to(device, non_blocking=True)
                            for k, v in self.__dict__.items()})


class TripDataset:
    """Trips with their driver indices, ready to batch.

    Args:
        trips: the trips (any split).
        vocab: driver vocabulary built on the training split.
        dtype: floating dtype of the batches (torch.float32 or torch.float64).
    """

    def __init__(self, trips: Trips, vocab: DriverVocab, dtype: torch.dtype = torch.float32):
        self.trips = trips
        self.vocab = vocab
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.trips)

    @property
    def lengths(self) -> np.ndarray:
        return self.trips.lengths

    def batch(self, idx) -> TripBatch:
        """Padded batch of trips ``idx`` ([B] ints, B ≥ 1), in that order. Only these trips' points are read
        (gathered from the columns of a view's base: a memory-mapped store is not copied; sub-trips of
        :class:`~stfast.data.subtrips.WithSubtrips` from their spans, rebased to their first point)."""
        if hasattr(self.trips, "spans"):
            tr, first, lens, f = self.trips.spans(idx)
            lens = np.asarray(lens, np.int64)
            off = lengths_to_offsets(lens)
            pt = np.repeat(np.asarray(first, np.int64) - off[:-1], lens) + np.arange(off[-1], dtype=np.int64)
            trip, rebase = f["trip"], (f["t0"], f["d0"])
        else:
            tr, trip = self.trips.locate(idx)
            pt, off = _gather_points(np.asarray(tr.offsets), trip)
            lens = np.diff(off)
            f, rebase = None, None
        b, lmax = len(trip), int(lens.max()) if len(trip) else 0
        rows = np.repeat(np.arange(b), lens)
        cols = np.arange(len(pt)) - np.repeat(off[:-1], lens)

        def pad(a, minus=None):
            out = np.zeros((b, lmax), dtype=np.float64)
            out[rows, cols] = a[pt] if minus is None else a[pt] - np.repeat(minus, lens)
            return torch.from_numpy(out).to(self.dtype)

        def vec(name, dt):
            a = getattr(tr, name)[trip] if f is None else f[name]
            return torch.from_numpy(np.ascontiguousarray(a)).to(dt)

        return TripBatch(
            lng=pad(tr.lng), lat=pad(tr.lat), state=pad(tr.state),
            time_gap=pad(tr.time_gap, rebase and rebase[0]), dist_gap=pad(tr.dist_gap, rebase and rebase[1]),
            lengths=torch.from_numpy(lens.astype(np.int64)),
            dist=vec("dist", self.dtype), time=vec("time", self.dtype),
            driver=torch.from_numpy(self.vocab.encode(tr.driver[trip])),
            week_id=vec("week_id", torch.int64), time_id=vec("time_id", torch.int64),
        )
