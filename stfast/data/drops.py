"""What reading and preprocessing dropped, by what was dropped: points, whole trips, or input records.

``Trips.dropped`` (and summary.json's ``dropped``, a store's manifest) is one flat dict {reason: count};
the reasons count different things. This module names the unit of each reason and writes the counts for
people, points apart from trips (docs/data.md, "What is dropped", explains every reason):

- points (a point is one GPS fix): :data:`POINT_KEYS`. ``points_of_dropped_trips`` counts the points of the
  trips dropped as a whole, so that kept points + dropped points = the input's points;
- trips (a whole trip, or a trajectory before it is cut into trips): :data:`TRIP_KEYS`;
- input records the reader skipped (lines, files): :data:`INPUT_KEYS`. A ``bad_line`` is a point in point
  formats (CSV, DiDi, GeoLife, T-Drive, Parquet rows) and a whole trip in DeepTTE JSON lines and Porto.

A reason not listed here (none today) is shown with the input records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .._plural import counted

#: reasons counted in points
POINT_KEYS = (
    "nonfinite_point",
    "duplicate_point",
    "nonpositive_time_gap",
    "speed_outlier",
    "stay_point",
    "resampled",
    "points_of_dropped_trips",
)
#: reasons counted in trips (or whole input trajectories)
TRIP_KEYS = ("mode_filtered", "too_short", "too_short_time", "too_short_dist", "too_long", "empty_trajectory",
             "missing_data", "empty_polyline", "no_valid_points")
#: reasons counted in input records the readers skipped (lines of a file, files)
INPUT_KEYS = ("bad_line", "bad_label_line", "empty_file")


def by_kind(dropped: dict) -> dict[str, dict[str, int]]:
    """``dropped`` ({reason: count}) split into {"points": ..., "trips": ..., "input": ...}, each {reason:
    count} without zero counts, in the order of the key tuples (an unknown reason goes to "input")."""
    out: dict[str, dict[str, int]] = {"points": {}, "trips": {}, "input": {}}
    for keys, kind in ((POINT_KEYS, "points"), (TRIP_KEYS, "trips"), (INPUT_KEYS, "input")):
        out[kind].update({k: int(dropped[k]) for k in keys if dropped.get(k)})
    out["input"].update({k: int(v) for k, v in sorted(dropped.items())
                         if v and k not in POINT_KEYS + TRIP_KEYS + INPUT_KEYS})
    return out


def describe(dropped: dict, kept_points: int | None = None) -> str:
    """One line for people: "dropped 143,839 points of 154,048 (stay_point 34,653, …); dropped 114 trips
    (too_short 61, …); skipped 2 input records (bad_line 2)"; only the parts with counts; "nothing dropped"
    when all are zero. ``kept_points``: the points left, to say "of N" input points (None: not said)."""
    parts = []
    kinds = by_kind(dropped)
    for kind, noun, note in (("points", "point", ""), ("trips", "trip", ""),
                             ("input", "input record", " (lines, files)")):
        counts = kinds[kind]
        if not counts:
            continue
        total = sum(counts.values())
        of = f" of {total + kept_points:,}" if kind == "points" and kept_points is not None else ""
        verb = "skipped" if kind == "input" else "dropped"
        reasons = ", ".join(f"{k} {v:,}" for k, v in counts.items())
        parts.append(f"{verb} {counted(total, noun, spec=',')}{note}{of} ({reasons})")
    return "; ".join(parts) or "nothing dropped"


@dataclass
class DroppedTrips:
    """The input trips that produced no trip, one row each, D rows.

    Columns: ``trip_id`` [D] object str (the input's id, as in ``Trips.trip_id``), ``segment`` [D]
    int64 (number of the piece within its input trajectory when preprocessing cut it into several,
    as in ``Trips.segment``; 0 for a trajectory dropped whole), ``reason`` [D] object str (a key of
    the ``dropped`` counts, see :mod:`stfast.data.preprocess` and the readers). Iterating yields
    ``(trip_id, segment, reason)`` tuples.

    Raises:
        ValueError: columns of different lengths.
    """

    trip_id: np.ndarray
    segment: np.ndarray
    reason: np.ndarray

    def __post_init__(self):
        self.trip_id = np.asarray(self.trip_id, dtype=object).reshape(-1)
        self.segment = np.asarray(self.segment, dtype=np.int64).reshape(-1)
        self.reason = np.asarray(self.reason, dtype=object).reshape(-1)
        if not len(self.trip_id) == len(self.segment) == len(self.reason):
            raise ValueError("DroppedTrips columns trip_id, segment, reason must have equal lengths, got "
                             f"{len(self.trip_id)}, {len(self.segment)}, {len(self.reason)}")

    def __len__(self) -> int:
        return len(self.trip_id)

    def __iter__(self) -> Iterator[tuple[str, int, str]]:
        return zip(map(str, self.trip_id), map(int, self.segment), map(str, self.reason))

    def __eq__(self, other) -> bool:
        return isinstance(other, DroppedTrips) and list(self) == list(other)

    @classmethod
    def empty(cls) -> "DroppedTrips":
        return cls(np.zeros(0, object), np.zeros(0, np.int64), np.zeros(0, object))

    @classmethod
    def of(cls, trip_ids, reason: str, segment=0) -> "DroppedTrips":
        """Rows for ``trip_ids`` ([D] str), all with one ``reason`` and ``segment`` (int or [D])."""
        ids = np.asarray(list(trip_ids) if not isinstance(trip_ids, np.ndarray) else trip_ids, dtype=object)
        return cls(ids, np.array(np.broadcast_to(np.asarray(segment, np.int64), ids.shape)),
                   np.full(len(ids), reason, object))

    @classmethod
    def concat(cls, parts: list["DroppedTrips"]) -> "DroppedTrips":
        """Rows of all ``parts``, in order."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("trip_id", "segment", "reason")))
