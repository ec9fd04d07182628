"""The training area: where a model has seen trips, as a grid of occupied cells.

A model trained on one city reads normalized coordinates; far from every training point its geo-conv
features are extrapolation, and its travel times are numbers without support. A bounding box is a poor
guard: a city's box holds rivers, hills and corners no trip crossed, and a box with a margin admits more
still. :class:`TrainingArea` keeps the cells (``cell_km`` squares, 1 km by default) that some training
point fell in, and admits a point when a cell within ``margin_cells`` (1) of its own is one of them: a point
is covered when a training point lies within about ``cell_km`` to ``(1 + margin_cells) × cell_km × √2`` of it.
The Chengdu sample's thousands of trips occupy a few hundred cells, so the area costs a few kB in a
checkpoint and a membership test is a binary search.

One rule for data outside a model's world, here beside the area: the service refuses a planned route with a
point outside (:func:`stfast.data.routes.routes_to_trips`); a recorded trip with such a point is *outside*
(:func:`trips_outside`), and data whose trips lie mostly outside is refused (:func:`check_inside`:
``stfast evaluate`` / ``predict`` and :meth:`stfast.TrainedModel.predict`) unless the caller asks to score
them anyway. A few outside trips (a test split's strays) are scored, counted and flagged. The model's other
inputs have no such outside: every weekday and minute of day is one of its calendar rows (the day of month is
not an input), and a driver it did not train on has a row of its own, the unseen driver's
(:meth:`stfast.TrainedModel.unseen_drivers` counts those trips; evaluate says how many).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._plural import counted
from .geo import EARTH_RADIUS_KM
from .trip_view import iter_chunks

KM_PER_DEG_LAT = EARTH_RADIUS_KM * math.pi / 180.0  # 111.19 km
MOST = 0.5
"""Data with more than this share of its trips outside the training area is refused (:func:`check_inside`)."""


class OutsideTrainingArea(ValueError):
    """Most trips of the data lie outside the model's training area (:func:`check_inside`).

    Attributes:
        n_outside, n_trips: trips outside, trips given.
    """

    def __init__(self, message: str, n_outside: int, n_trips: int):
        super().__init__(message)
        self.n_outside, self.n_trips = n_outside, n_trips


@dataclass
class TrainingArea:
    """Occupied grid cells of the training points.

    Attributes:
        lng0, lat0: the grid's origin (degrees): the south-west corner of the training points' bounding box.
        cell_lng, cell_lat: a cell's size in degrees (``cell_km`` north-south; east-west at the mean latitude).
        cells: [C, 2] int64 (column, row) of every cell holding a training point, sorted.
        bbox: (min lng, min lat, max lng, max lat) of the training points, degrees.
        cell_km: the cell's size in km. margin_cells: neighbouring cells that also count as covered.
    """

    lng0: float
    lat0: float
    cell_lng: float
    cell_lat: float
    cells: np.ndarray
    bbox: tuple
    cell_km: float = 1.0
    margin_cells: int = 1

    @classmethod
    def from_points(cls, lng, lat, cell_km: float = 1.0, margin_cells: int = 1) -> "TrainingArea":
        """The area of points ``lng``, ``lat`` ([N] degrees, N ≥ 1, finite). Raises ValueError on no points."""
        return cls.from_point_chunks(lambda: iter([(lng, lat)]), cell_km, margin_cells)

    @classmethod
    def from_point_chunks(cls, chunks, cell_km: float = 1.0, margin_cells: int = 1) -> "TrainingArea":
        """The area of the points ``chunks()`` yields as (lng, lat) pairs of [n_i] degrees, read twice (bounds,
        then cells), one pair at a time: bounded memory for the points of any number of trips. One pair gives
        :meth:`from_points`'s area exactly. Raises ValueError on no points."""
        lo, hi, means, counts = [], [], [], []
        for lng, lat in chunks():
            lng, lat = np.asarray(lng, dtype=np.float64), np.asarray(lat, dtype=np.float64)
            if lng.size:
                lo.append((lng.min(), lat.min()))
                hi.append((lng.max(), lat.max()))
                means.append(float(lat.mean()))
                counts.append(lng.size)
        if not counts:
            raise ValueError("a training area needs at least one point")
        (lng0, lat0), (lng1, lat1) = np.min(lo, axis=0), np.max(hi, axis=0)
        mean_lat = means[0] if len(means) == 1 else float(np.average(means, weights=counts))
        cell_lat = cell_km / KM_PER_DEG_LAT
        cell_lng = cell_lat / max(math.cos(math.radians(mean_lat)), 1e-3)
        area = cls(float(lng0), float(lat0), cell_lng, cell_lat, np.zeros((0, 2), np.int64),
                   (float(lng0), float(lat0), float(lng1), float(lat1)), float(cell_km), int(margin_cells))
        # as int64 keys (cells of the area's own points have column, row >= 0): a 1-D unique, in the order of
        # np.unique(cells, axis=0), many times faster
        keys = np.zeros(0, dtype=np.int64)
        for lng, lat in chunks():  # merged piece by piece: memory is the area's cells, not the points
            keys = np.union1d(keys, area._keys(area._cell(lng, lat)))
        area.cells = np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1).astype(np.int64)
        return area

    def _cell(self, lng, lat) -> np.ndarray:
        return np.stack([np.floor((np.asarray(lng) - self.lng0) / self.cell_lng),
                         np.floor((np.asarray(lat) - self.lat0) / self.cell_lat)], axis=-1).astype(np.int64)

    def _keys(self, cells: np.ndarray) -> np.ndarray:
        # rows fit in 2**31 for any cell of the globe at ≥ 1 m cells; one int64 key per cell
        return cells[:, 0] * (1 << 32) + cells[:, 1]

    def covers(self, lng, lat) -> np.ndarray:
        """[n] bool: whether each point (``lng``, ``lat`` [n] degrees, finite) is inside the area."""
        if getattr(self, "_covered", None) is None:  # the cells and their margins, as sorted keys, once per area
            m = np.arange(-self.margin_cells, self.margin_cells + 1)
            near = (self.cells[:, None, :] + np.stack(np.meshgrid(m, m), -1).reshape(1, -1, 2)).reshape(-1, 2)
            self._covered = np.unique(self._keys(near))
        keys = self._keys(self._cell(lng, lat).reshape(-1, 2))
        if len(self._covered) == 0:
            return np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(self._covered, keys), len(self._covered) - 1)
        return self._covered[pos] == keys

    def extended(self, chunks) -> "TrainingArea":
        """This area grown by the cells of the points ``chunks()`` yields ((lng, lat) pairs of [n_i] degrees, read
        twice), on this area's grid: the same cell size, the origin moved by whole cells to the south-west where
        the points reach past it, so every cell of this area is a cell of the result (a warm start's area: the
        union of the model's and the new training split's). Bounded memory, as :meth:`from_point_chunks`."""
        lo = np.zeros(2, dtype=np.int64)
        box = list(self.bbox)
        for lng, lat in chunks():
            lng, lat = np.asarray(lng, dtype=np.float64), np.asarray(lat, dtype=np.float64)
            if lng.size:
                lo = np.minimum(lo, self._cell(lng, lat).min(axis=0))
                box = [min(box[0], lng.min()), min(box[1], lat.min()), max(box[2], lng.max()), max(box[3], lat.max())]
        shift = -lo  # whole cells the origin moves west and south: every column and row stays >= 0
        area = TrainingArea(self.lng0 - shift[0] * self.cell_lng, self.lat0 - shift[1] * self.cell_lat,
                            self.cell_lng, self.cell_lat, np.zeros((0, 2), np.int64), tuple(float(b) for b in box),
                            self.cell_km, self.margin_cells)
        keys = np.unique(area._keys(self.cells + shift))
        for lng, lat in chunks():  # cells on the old grid, then shifted: the old cells' edges exactly
            keys = np.union1d(keys, area._keys(self._cell(lng, lat).reshape(-1, 2) + shift))
        area.cells = np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1).astype(np.int64)
        return area

    def to_dict(self) -> dict:
        """JSON-able (checkpoints, ``GET /healthz``)."""
        return {"lng0": self.lng0, "lat0": self.lat0, "cell_lng": self.cell_lng, "cell_lat": self.cell_lat,
                "cells": self.cells.tolist(), "bbox": list(self.bbox), "cell_km": self.cell_km,
                "margin_cells": self.margin_cells}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingArea":
        return cls(d["lng0"], d["lat0"], d["cell_lng"], d["cell_lat"],
                   np.asarray(d["cells"], dtype=np.int64).reshape(-1, 2), tuple(d["bbox"]), d["cell_km"],
                   d["margin_cells"])


def trips_outside(area: TrainingArea | None, trips) -> np.ndarray:
    """[T] bool: the trips of ``trips`` (Trips or a TripsView, read in pieces) with at least one point outside
    ``area`` (the service's rule for a planned route). ``area`` None (a checkpoint that records none): all False."""
    out = np.zeros(len(trips), dtype=bool)
    if area is None or len(trips) == 0:
        return out
    at = 0
    for part in iter_chunks(trips, point_fields=("lng", "lat")):
        n = len(part)
        covered = area.covers(np.asarray(part.lng), np.asarray(part.lat))
        trip_of_point = np.repeat(np.arange(n), np.diff(np.asarray(part.offsets)))
        out[at:at + n] = np.bincount(trip_of_point[~covered], minlength=n) > 0
        at += n
    return out


def check_inside(area: TrainingArea | None, outside: np.ndarray, trips, whose: str, fix: str,
                 anyway: str = "to score them anyway") -> None:
    """Refuse data whose trips lie mostly outside ``area`` (more than :data:`MOST` of them; ``outside`` is
    :func:`trips_outside`'s [T] mask of ``trips``): a model's travel times where it saw no trip have no support.
    ``whose``: the model, as the message names it; ``fix``: how the caller scores them anyway (a flag, an
    argument), ``anyway``: what it does then. Raises OutsideTrainingArea, one line naming how many, the model's area and the data's."""
    n, k = len(outside), int(np.count_nonzero(outside))
    if area is None or n == 0 or k <= MOST * n:
        return
    box = [np.inf, np.inf, -np.inf, -np.inf]
    for part in iter_chunks(trips, point_fields=("lng", "lat")):
        lng, lat = np.asarray(part.lng), np.asarray(part.lat)
        if len(lng):
            box = [min(box[0], lng.min()), min(box[1], lat.min()), max(box[2], lng.max()), max(box[3], lat.max())]
    lie = "lies" if k == 1 else "lie"
    raise OutsideTrainingArea(
        f"{k:,} of {counted(n, 'trip', spec=',')} ({100 * k / n:.0f} %) {lie} outside the training area of {whose} "
        "(its training points: "
        f"{box_text(area.bbox)}, {len(area.cells)} cells of {area.cell_km:g} km; the data's points: {box_text(box)}): "
        f"its travel times there have no support; give data of its area, or {fix} {anyway}", k, n)


def box_text(b) -> str:
    """A bounding box (min lng, min lat, max lng, max lat) in words."""
    return f"lng {b[0]:.4f}..{b[2]:.4f}, lat {b[1]:.4f}..{b[3]:.4f}"
