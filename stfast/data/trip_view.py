"""Trips of another set, by index, without copying them: what a run's train/validation/test splits are.

A 10 M-trip trips store (:mod:`stfast.data.store`) is memory-mapped: its columns are pages of the OS page
cache that every rank of ``--nproc N`` shares. :meth:`Trips.subset` copies the trips it selects, so
splits made by it would hold the store's points in each rank's own memory. A :class:`TripsView` keeps
the store's columns and an index of trip numbers instead; the points of a batch are gathered when it is
collated (:meth:`stfast.data.dataset.TripDataset.batch`), and what needs every point of a split
(normalization statistics, the training area) walks it in bounded pieces (:func:`iter_chunks`).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .csr import _gather_points, lengths_to_offsets
from .drops import DroppedTrips

#: points gathered at a time by :func:`iter_chunks` (36 bytes each over the five point columns)
CHUNK_POINTS = 4_000_000


class TripsView:
    """Trips ``index`` of ``base``, in that order: reads like :class:`~stfast.data.trips.Trips` (``len``,
    ``lengths``, ``offsets``, ``n_points``, every point and trip field, ``record``, ``subset``) without a copy
    of ``base``'s columns.

    A trip field ([T], e.g. ``time``, ``trip_id``) is gathered on first use and kept; a point field ([N], e.g.
    ``lng``) is gathered on every use (it is as large as the view's points: code that walks all of them uses
    :func:`iter_chunks`). Metadata as :meth:`Trips.subset` gives it: ``tz`` and ``preprocess_config`` of
    ``base``; ``dropped`` empty, ``dropped_trips`` empty, ``fingerprint`` None (other trips than ``base``'s).

    Args:
        base: a :class:`Trips` (e.g. a memory-mapped store) or another view (the view of a view indexes the
            first one's base directly).
        index: [T] int trip numbers of ``base`` (or a boolean mask over its trips).

    Raises:
        IndexError: an index outside ``base``'s trips.
    """

    def __init__(self, base, index):
        index = np.asarray(index)
        index = np.flatnonzero(index) if index.dtype == bool else index.astype(np.int64, copy=False).reshape(-1)
        lo = int(index.min()) if len(index) else 0
        if len(index) and (lo < -len(base) or index.max() >= len(base)):
            raise IndexError(f"trip index out of range for {len(base)} trips")
        if lo < 0:  # else kept as given: a memory-mapped index (stfast.data.derived) stays shared, not copied
            index = np.where(index < 0, index + len(base), index)
        if isinstance(base, TripsView):
            base, index = base.base, base.index[index]
        self.base, self.index = base, index
        self.tz, self.preprocess_config = base.tz, base.preprocess_config
        self.dropped, self.dropped_trips, self.fingerprint = {}, DroppedTrips.empty(), None
        self._fields: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.index)

    def __getattr__(self, name: str):
        # only reached for what __init__ did not set: the fields of Trips
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self.base._TRIP_FIELDS:
            if name not in self._fields:
                self._fields[name] = np.asarray(getattr(self.base, name)[self.index])
            return self._fields[name]
        if name in self.base._POINT_FIELDS:
            return np.asarray(getattr(self.base, name)[self._points()])
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def lengths(self) -> np.ndarray:
        """[T] int64: points per trip (kept after the first use)."""
        if "lengths" not in self._fields:
            off = self.base.offsets
            self._fields["lengths"] = np.asarray(off[self.index + 1] - off[self.index], dtype=np.int64)
        return self._fields["lengths"]

    @property
    def offsets(self) -> np.ndarray:
        """[T + 1] int64 CSR offsets of the view's own points (kept after the first use)."""
        if "offsets" not in self._fields:
            self._fields["offsets"] = lengths_to_offsets(self.lengths)
        return self._fields["offsets"]

    @property
    def n_points(self) -> int:
        return int(self.offsets[-1])

    def _points(self) -> np.ndarray:
        return _gather_points(np.asarray(self.base.offsets), self.index)[0]

    def locate(self, idx) -> tuple[Trips, np.ndarray]:
        """Where trips ``idx`` ([B] int, of this view) are: (the base Trips, [B] int64 trip numbers in it)."""
        return self.base, self.index[np.asarray(idx, dtype=np.int64)]

    def points(self, i: int) -> slice:
        """Slice of trip ``i``'s points in the view's point fields."""
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def subset(self, idx) -> "TripsView":
        """The trips ``idx`` (int array or boolean mask over this view's trips) of this view, as a view."""
        return TripsView(self, idx)

    def view(self, idx) -> "TripsView":
        return TripsView(self, idx)

    def materialize(self) -> Trips:
        """The view's trips copied into a :class:`Trips` (as :meth:`Trips.subset` of ``base`` would give them)."""
        return self.base.subset(self.index)

    def record(self, i: int) -> dict:
        """Trip ``i`` as a DeepTTE JSON record (:meth:`Trips.record`)."""
        return self.base.record(int(self.index[i]))

    def records(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.record(i)

    def to_jsonl(self, path) -> None:
        """Write DeepTTE JSON lines, atomically (:meth:`Trips.to_jsonl`)."""
        self.materialize().to_jsonl(path)


def iter_chunks(trips, max_points: int = CHUNK_POINTS, point_fields: tuple[str, ...] | None = None) -> Iterator[Trips]:
    """``trips`` (Trips or TripsView) as consecutive Trips of about ``max_points`` points each (whole trips; a
    longer trip alone), in order, so that a pass over every point of a split of any size holds one piece at a
    time. Trips that fit in one piece come as one: ``trips`` itself, or a view's trips copied.
    ``point_fields``: the point fields a pass reads; a piece copied from ``trips`` gathers only these (the
    others None: over a store's split, each column is a gather of its pages), :meth:`Trips.subset`."""
    n = trips.n_points
    if n <= max_points or len(trips) <= 1:
        yield trips.base.subset(trips.index, point_fields) if isinstance(trips, TripsView) else trips
        return
    ends = np.cumsum(trips.lengths)
    start = 0
    while start < len(trips):
        stop = max(int(np.searchsorted(ends, (ends[start - 1] if start else 0) + max_points, side="right")), start + 1)
        base, idx = (trips.base, trips.index[start:stop]) if isinstance(trips, TripsView) else (trips, np.arange(start, stop))
        yield base.subset(idx, point_fields)
        start = stop
