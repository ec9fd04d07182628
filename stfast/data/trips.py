"""Trajectories and trips in CSR layout: flat point arrays plus offsets.

Two stages share the layout:

* :class:`Trajectories` — raw GPS traces as read from a file (absolute timestamps, no derived
  quantities). Readers of GeoLife, DiDi GAIA and generic CSV produce them; the synthetic city too.
* :class:`Trips` — preprocessed trips as DeepTTE consumes them (cumulative ``time_gap``/``dist_gap``,
  label ``time``, ``weekID``/``timeID``/``dateID``). :func:`stfast.data.preprocess.preprocess` makes
  them from Trajectories; the DeepTTE JSON-lines reader produces them directly.

CSR (``offsets`` of length T + 1, trip ``i`` owns points ``offsets[i]:offsets[i+1]``) keeps a million
trips in a few flat numpy arrays instead of a million Python objects.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

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


class _CSR:
    """Shared behaviour of the two CSR containers: per-point and per-trip arrays, subset, concat."""

    offsets: np.ndarray
    _POINT_FIELDS: tuple[str, ...] = ()
    _TRIP_FIELDS: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """[T] int64: points per trip."""
        return np.diff(self.offsets)

    @property
    def n_points(self) -> int:
        return int(self.offsets[-1])

    def _validate(self) -> None:
        off = self.offsets
        if off.ndim != 1 or len(off) < 1 or off[0] != 0 or np.any(np.diff(off) < 0):
            raise ValueError("offsets must be a non-decreasing 1-D array starting at 0")
        n, t = int(off[-1]), len(off) - 1
        for name in self._POINT_FIELDS:
            a = getattr(self, name)
            if a is not None and len(a) != n:
                raise ValueError(f"point field {name} has {len(a)} values, offsets say {n}")
        for name in self._TRIP_FIELDS:
            a = getattr(self, name)
            if a is not None and len(a) != t:
                raise ValueError(f"trip field {name} has {len(a)} values, offsets say {t} trips")

    def subset(self, idx) -> "_CSR":
        """The trips ``idx`` (int array or boolean mask over trips), in that order."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        pt, new_off = _gather_points(self.offsets, idx)
        kw = {"offsets": new_off}
        for name in self._POINT_FIELDS:
            a = getattr(self, name)
            kw[name] = None if a is None else a[pt]
        for name in self._TRIP_FIELDS:
            a = getattr(self, name)
            kw[name] = None if a is None else a[idx]
        return type(self)(**kw)

    @classmethod
    def concat(cls, parts: list) -> "_CSR":
        """Concatenate containers of the same type (trip order kept)."""
        if not parts:
            return cls.empty()
        offs = [p.offsets for p in parts]
        lens = np.concatenate([np.diff(o) for o in offs])
        kw = {"offsets": lengths_to_offsets(lens)}
        for name in cls._POINT_FIELDS + cls._TRIP_FIELDS:
            vals = [getattr(p, name) for p in parts]
            kw[name] = None if any(v is None for v in vals) else np.concatenate(vals)
        return cls(**kw)

    @classmethod
    def empty(cls) -> "_CSR":
        kw = {"offsets": np.zeros(1, dtype=np.int64)}
        for name in cls._POINT_FIELDS + cls._TRIP_FIELDS:
            kw[name] = np.zeros(0, dtype=object if name in ("driver", "source", "mode") else np.float64)
        return cls(**kw)

    def points(self, i: int) -> slice:
        """Slice of trip ``i``'s points in the flat arrays."""
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


@dataclass
class Trajectories(_CSR):
    """Raw GPS trajectories, T traces with N points in all.

    Point fields ([N]): ``lng``, ``lat`` (float64, degrees WGS-84), ``t`` (float64, Unix seconds UTC),
    ``state`` (float32, 0/1 taxi occupied; 0 where unknown), ``mode`` (object str transport mode from
    GeoLife labels, "" where unlabelled; None when the source has no labels).
    Trip fields ([T]): ``driver`` (object str: user, driver or vehicle id), ``source`` (object str:
    the file the trace came from, for messages).
    """

    offsets: np.ndarray
    lng: np.ndarray
    lat: np.ndarray
    t: np.ndarray
    state: np.ndarray
    driver: np.ndarray
    source: np.ndarray
    mode: np.ndarray | None = None
    # per-reason counts of what the reader skipped (for example {"empty_file": 2})
    dropped: dict = field(default_factory=dict, compare=False)

    _POINT_FIELDS = ("lng", "lat", "t", "state", "mode")
    _TRIP_FIELDS = ("driver", "source")

    def __post_init__(self):
        self._validate()


@dataclass
class Trips(_CSR):
    """Preprocessed trips in DeepTTE's terms, T trips with N points in all.

    Point fields ([N]): ``lng``, ``lat`` (float64, degrees), ``state`` (float32, 0/1),
    ``time_gap`` (float64, seconds since the trip's first point, cumulative, starts at 0),
    ``dist_gap`` (float64, km since the first point, cumulative haversine, starts at 0).
    Trip fields ([T]): ``dist`` (float64, km), ``time`` (float64, travel time in seconds, the label),
    ``driver`` (object str), ``week_id`` (int64, 0..6, Monday = 0), ``time_id`` (int64, minute of day
    of departure, 0..1439), ``date_id`` (int64, day of month).

    Source: the record format of Wang et al., "When Will You Arrive?" (AAAI 2018), UrbComp/DeepTTE.
    """

    offsets: np.ndarray
    lng: np.ndarray
    lat: np.ndarray
    state: np.ndarray
    time_gap: np.ndarray
    dist_gap: np.ndarray
    dist: np.ndarray
    time: np.ndarray
    driver: np.ndarray
    week_id: np.ndarray
    time_id: np.ndarray
    date_id: np.ndarray
    # per-reason counts of what preprocessing dropped on the way to these trips
    dropped: dict = field(default_factory=dict, compare=False)

    _POINT_FIELDS = ("lng", "lat", "state", "time_gap", "dist_gap")
    _TRIP_FIELDS = ("dist", "time", "driver", "week_id", "time_id", "date_id")

    def __post_init__(self):
        self._validate()

    def record(self, i: int) -> dict:
        """Trip ``i`` as a DeepTTE JSON record (keys as in the original data)."""
        s = self.points(i)
        return {
            "time_gap": self.time_gap[s].tolist(),
            "dist": float(self.dist[i]),
            "lats": self.lat[s].tolist(),
            "driverID": _driver_json(self.driver[i]),
            "weekID": int(self.week_id[i]),
            "states": self.state[s].astype(float).tolist(),
            "timeID": int(self.time_id[i]),
            "dateID": int(self.date_id[i]),
            "time": float(self.time[i]),
            "lngs": self.lng[s].tolist(),
            "dist_gap": self.dist_gap[s].tolist(),
        }

    def records(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.record(i)

    def to_jsonl(self, path: str | os.PathLike) -> None:
        """Write DeepTTE JSON lines, atomically (temp file, then rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            for r in self.records():
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, path)

    # ---- binary save / memory-mapped load (large data sets)
    def save(self, path: str | os.PathLike) -> None:
        """Write the trips as a folder of ``.npy`` files (one per field; ``driver`` as fixed-width
        unicode) plus ``meta.json`` (format, ``dropped``), atomically: a temp folder renamed into place.
        An existing folder at ``path`` is replaced. Raises OSError on write failures."""
        import shutil

        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in ("offsets", *self._POINT_FIELDS, *self._TRIP_FIELDS):
            a = getattr(self, name)
            np.save(tmp / f"{name}.npy", a.astype(str) if a.dtype == object else a, allow_pickle=False)
        (tmp / "meta.json").write_text(json.dumps({"format": TRIPS_FORMAT, "dropped": self.dropped}))
        old = path.with_name(f".{path.name}.old{os.getpid()}")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True) -> "Trips":
        """Trips written by :meth:`save`. With ``mmap`` the arrays are read-only memory maps (pages
        are read on first touch; resident memory stays small until used); ``driver`` is then a
        fixed-width unicode array ``<U*``, not object. Raises ValueError if ``path`` is not such a folder."""
        path = Path(path)
        meta_p = path / "meta.json"
        meta = json.loads(meta_p.read_text()) if meta_p.is_file() else {}
        if meta.get("format") != TRIPS_FORMAT:
            raise ValueError(f"{path} is not a trips folder written by Trips.save (no {TRIPS_FORMAT} meta.json)")
        kw = {name: np.load(path / f"{name}.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
              for name in ("offsets", *cls._POINT_FIELDS, *cls._TRIP_FIELDS)}
        return cls(**kw, dropped=meta.get("dropped", {}))


TRIPS_FORMAT = "stfast-trips/1"


def _driver_json(d):
    s = str(d)
    return int(s) if s.lstrip("-").isdigit() else s
