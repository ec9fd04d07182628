"""TripDataset: trips + normalization statistics + driver vocabulary → padded tensor batches.

The statistics and the vocabulary (computed on the training split only) are :mod:`stfast.data.training_stats`'s,
re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .training_stats import DriverVocab, NormStats, local_spans  # noqa: F401 (re-exported)
from .trips import Trips, _gather_points, lengths_to_offsets


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
