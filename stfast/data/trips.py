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

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.csr import _gather_points, lengths_to_offsets
from stfast.data.drops import DroppedTrips
from stfast.data.preprocess_config import PreprocessConfig
from stfast.data.trip_view import TripsView

__all__ = ["DroppedTrips", "Trajectories", "Trips", "lengths_to_offsets"]
log = logging.getLogger(__name__)


_CHECK_CHUNK = 1 << 20  # offsets checked this many at a time


class _CSR:
    """Shared behaviour of the two CSR containers: per-point and per-trip arrays, subset, concat.

    Besides the arrays a container carries metadata (not compared by ``==``): ``dropped`` and
    ``dropped_trips`` describe the load that made it (summed / concatenated by :meth:`concat`, not
    kept by :meth:`subset`); ``tz`` (and for Trips ``preprocess_config``) describe how every trip's
    fields were computed (kept by :meth:`subset`, kept by :meth:`concat` when all parts agree, else
    None).
    """

    offsets: np.ndarray
    _POINT_FIELDS: tuple[str, ...] = ()
    _TRIP_FIELDS: tuple[str, ...] = ()
    _OBJECT_FIELDS = frozenset({"driver", "source", "mode", "trip_id"})
    _INT_FIELDS = frozenset({"week_id", "time_id", "date_id", "segment"})
    _KEPT_META: tuple[str, ...] = ("tz",)  # metadata that subset keeps

    def _fill_trip_ids(self) -> None:
        """Defaults of the id fields: trip ``i`` is ``str(i)``; segment 0 (where the class has it)."""
        t = len(self.offsets) - 1
        if self.trip_id is None:
            self.trip_id = np.arange(t).astype(str).astype(object)
        if "segment" in self._TRIP_FIELDS and self.segment is None:
            self.segment = np.zeros(t, dtype=np.int64)

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
        # in slices, so a memory-mapped store of millions of trips is checked without a copy of its offsets
        if off.ndim != 1 or len(off) < 1 or off[0] != 0 or any(
                np.any(np.diff(off[s:s + _CHECK_CHUNK + 1]) < 0) for s in range(0, len(off), _CHECK_CHUNK)):
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

    def subset(self, idx, point_fields: tuple[str, ...] | None = None) -> "_CSR":
        """The trips ``idx`` (int array or boolean mask over trips), in that order. ``point_fields``: only these
        point fields are gathered, the others are None (a pass that reads two columns of a store's split need
        not copy all of them); None: every field."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        pt, new_off = _gather_points(self.offsets, idx)
        kw = {"offsets": new_off}
        if point_fields is not None and not set(point_fields) <= set(self._POINT_FIELDS):
            raise ValueError(f"point_fields {sorted(set(point_fields) - set(self._POINT_FIELDS))} are not point "
                             f"fields of {type(self).__name__} ({', '.join(self._POINT_FIELDS)})")
        for name in self._POINT_FIELDS:
            a = getattr(self, name) if point_fields is None or name in point_fields else None
            kw[name] = None if a is None else a[pt]
        for name in self._TRIP_FIELDS:
            a = getattr(self, name)
            kw[name] = None if a is None else a[idx]
        for name in self._KEPT_META:
            kw[name] = getattr(self, name)
        return type(self)(**kw)

    def locate(self, idx) -> tuple["_CSR", np.ndarray]:
        """Where trips ``idx`` ([B] int) are: (this container, [B] int64), as :meth:`TripsView.locate` answers
        for a view (:mod:`stfast.data.trip_view`)."""
        return self, np.asarray(idx, dtype=np.int64)

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
        for name in cls._KEPT_META:
            vals = [getattr(p, name) for p in parts]
            kw[name] = vals[0] if all(v == vals[0] for v in vals) else None
        kw["dropped"] = {}
        for p in parts:
            for k, v in p.dropped.items():
                kw["dropped"][k] = kw["dropped"].get(k, 0) + v
        kw["dropped_trips"] = DroppedTrips.concat([p.dropped_trips for p in parts])
        return cls(**kw)

    @classmethod
    def empty(cls) -> "_CSR":
        """No trips (every field a 0-length array of its dtype)."""
        kw = {"offsets": np.zeros(1, dtype=np.int64)}
        for name in cls._POINT_FIELDS + cls._TRIP_FIELDS:
            dt = object if name in cls._OBJECT_FIELDS else np.int64 if name in cls._INT_FIELDS else np.float64
            kw[name] = np.zeros(0, dtype=np.float32 if name == "state" else dt)
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
    ``utc_offset_s`` (float64 seconds, local − UTC, as written in the point's timestamp; NaN where
    the timestamp carried no offset; None when the source has no such offsets: only the point CSV has).
    Trip fields ([T]): ``driver`` (object str: user, driver or vehicle id), ``source`` (object str:
    the file the trace came from, for messages), ``trip_id`` (object str: the input's own id of the
    trace — CSV ``trip_id``, DiDi ``order_id``, GeoLife ``<user>/<file stem>``; default ``str(i)``).

    Metadata: ``dropped`` (per-reason counts of what the reader skipped, e.g. ``{"empty_file": 2}``),
    ``dropped_trips`` (:class:`DroppedTrips`: the skipped traces whose id is known), ``tz`` (the
    source's time zone, the default of :func:`~stfast.data.preprocess.preprocess`: an IANA name or
    :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`; default "UTC").

    Raises:
        ValueError: field lengths that disagree with ``offsets``.
    """

    offsets: np.ndarray
    lng: np.ndarray
    lat: np.ndarray
    t: np.ndarray
    state: np.ndarray
    driver: np.ndarray
    source: np.ndarray
    mode: np.ndarray | None = None
    trip_id: np.ndarray | None = None
    utc_offset_s: np.ndarray | None = None
    dropped: dict = field(default_factory=dict, compare=False)
    dropped_trips: DroppedTrips = field(default_factory=DroppedTrips.empty, compare=False)
    tz: str = field(default="UTC", compare=False)

    _POINT_FIELDS = ("lng", "lat", "t", "state", "mode", "utc_offset_s")
    _TRIP_FIELDS = ("driver", "source", "trip_id")

    def __post_init__(self):
        self._fill_trip_ids()
        self._validate()


@dataclass
class Trips(_CSR):
    """Preprocessed trips in DeepTTE's terms, T trips with N points in all.

    Point fields ([N]): ``lng``, ``lat`` (float64, degrees), ``state`` (float32, 0/1),
    ``time_gap`` (float64, seconds since the trip's first point, cumulative, starts at 0),
    ``dist_gap`` (float64, km since the first point, cumulative haversine, starts at 0).
    Trip fields ([T]): ``dist`` (float64, km), ``time`` (float64, travel time in seconds, the label),
    ``driver`` (object str), ``week_id`` (int64, 0..6, Monday = 0), ``time_id`` (int64, minute of day
    of departure, 0..1439), ``date_id`` (int64, day of month), all three in local time;
    ``trip_id`` (object str, the id of the input trip it came from; default ``str(i)``) and
    ``segment`` (int64, 0-based number of the trip within its input trajectory where preprocessing cut
    one trajectory into several; default 0): ``(trip_id, segment)`` joins a trip back to its input.

    Metadata (see :class:`_CSR` for what subset/concat do with it): ``dropped`` (per-reason counts of
    what reading and preprocessing dropped), ``dropped_trips`` (:class:`DroppedTrips`, one row per
    input trip or piece that produced no trip), ``tz`` (the time zone of the calendar ids: an IANA
    name, :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`, or None when unknown), ``preprocess_config``
    (the :class:`~stfast.data.preprocess.PreprocessConfig` that made the trips, its ``tz`` resolved;
    None when they were read as DeepTTE records).

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
    trip_id: np.ndarray | None = None
    segment: np.ndarray | None = None
    dropped: dict = field(default_factory=dict, compare=False)
    dropped_trips: DroppedTrips = field(default_factory=DroppedTrips.empty, compare=False)
    tz: str | None = field(default=None, compare=False)
    preprocess_config: object = field(default=None, compare=False)
    # what the trip filters saw (stfast.data.trip_filters.TripFilterTally), to say why no trip was left: set by the
    # load that made the trips; not kept by subset or concat
    trip_filters: object = field(default=None, compare=False, repr=False)
    # the data fingerprint when known without hashing (a trips store records it at conversion); not kept by
    # subset or concat, which make other trips
    fingerprint: str | None = field(default=None, compare=False, repr=False)

    _POINT_FIELDS = ("lng", "lat", "state", "time_gap", "dist_gap")
    _TRIP_FIELDS = ("dist", "time", "driver", "week_id", "time_id", "date_id", "trip_id", "segment")
    _KEPT_META = ("tz", "preprocess_config")

    def __post_init__(self):
        self._fill_trip_ids()
        self._validate()

    def view(self, idx):
        """The trips ``idx`` (int array or boolean mask over trips), in that order, as a
        :class:`~stfast.data.trip_view.TripsView`: no copy of the columns (a memory-mapped store stays shared)."""
        return TripsView(self, idx)

    def record(self, i: int) -> dict:
        """Trip ``i`` as a DeepTTE JSON record: the keys of the original data, plus ``tripID`` (str),
        ``segment`` (int) and, when known, ``tz`` (the time zone of the calendar ids), which
        :func:`~stfast.data.readers.read_deeptte_jsonl` reads back."""
        s = self.points(i)
        tz = {} if self.tz is None else {"tz": self.tz}
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
            "tripID": str(self.trip_id[i]),
            "segment": int(self.segment[i]),
            **tz,
        }

    def records(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.record(i)

    def to_jsonl(self, path: str | os.PathLike) -> None:
        """Write DeepTTE JSON lines, atomically (temp file, then rename; a failed write removes the temp file).
        Raises OSError."""
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                for r in self.records():
                    f.write(json.dumps(r) + "\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # ---- binary save / memory-mapped load (large data sets)
    def save(self, path: str | os.PathLike) -> None:
        """Write the trips as a folder of ``.npy`` files (one per field, ``dropped_trips`` as
        ``dropped_<column>.npy``; str fields as fixed-width unicode) plus ``meta.json`` (format,
        ``dropped``, ``tz``, ``preprocess_config``), atomically: a temp folder renamed into place.
        An existing folder at ``path`` is replaced: it is renamed aside (``.<name>.old<pid>``) and the new
        one renamed in; a save killed between the two renames leaves only the aside copy, which
        :meth:`load` then reads, so the previous data set is never lost. Raises OSError on write failures."""
        import shutil

        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        arrays = {name: getattr(self, name) for name in ("offsets", *self._POINT_FIELDS, *self._TRIP_FIELDS)}
        arrays.update({f"dropped_{c}": getattr(self.dropped_trips, c) for c in _DROPPED_COLUMNS})
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", a.astype(str) if a.dtype == object else a, allow_pickle=False)
        cfg = self.preprocess_config
        meta = {"format": TRIPS_FORMAT, "dropped": self.dropped, "tz": self.tz,
                "preprocess_config": None if cfg is None else cfg.to_dict()}
        (tmp / "meta.json").write_text(json.dumps(meta))
        old = path.with_name(f".{path.name}.old{os.getpid()}")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        for stale in [old, *_set_aside(path)]:  # this save's, and any a killed save left
            shutil.rmtree(stale, ignore_errors=True)

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True) -> "Trips":
        """Trips written by :meth:`save`. With ``mmap`` the arrays are read-only memory maps (pages
        are read on first touch; resident memory stays small until used); ``driver`` is then a
        fixed-width unicode array ``<U*``, not object (so is ``trip_id``). A folder of the older
        format ``stfast-trips/1`` loads with the default ids (``str(i)``, segment 0). When ``path`` is
        missing because a :meth:`save` over it was killed between its two renames, the folder that save had
        set aside is read (with a warning naming it). Raises ValueError if ``path`` is not such a folder."""
        path = Path(path)
        if not path.exists() and (aside := _set_aside(path)):
            log.warning("%s is missing (a save over it was interrupted): reading the previous version it set "
                        "aside, %s", path, aside[0])
            path = aside[0]
        meta_p = path / "meta.json"
        meta = json.loads(meta_p.read_text()) if meta_p.is_file() else {}
        if meta.get("format") not in (TRIPS_FORMAT, "stfast-trips/1"):
            raise ValueError(f"{path} is not a trips folder written by Trips.save (no {TRIPS_FORMAT} meta.json)")

        def load(name):
            p = path / f"{name}.npy"
            return np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False) if p.is_file() else None

        kw = {name: load(name) for name in ("offsets", *cls._POINT_FIELDS, *cls._TRIP_FIELDS)}
        cols = [load(f"dropped_{c}") for c in _DROPPED_COLUMNS]
        cfg = meta.get("preprocess_config")
        if cfg is not None:
            cfg = PreprocessConfig.from_dict(cfg)
        return cls(**kw, dropped=meta.get("dropped", {}), tz=meta.get("tz"), preprocess_config=cfg,
                   dropped_trips=DroppedTrips.empty() if cols[0] is None else DroppedTrips(*cols))


TRIPS_FORMAT = "stfast-trips/2"
_DROPPED_COLUMNS = ("trip_id", "segment", "reason")


def _set_aside(path: Path) -> list[Path]:
    """Folders a :meth:`Trips.save` over ``path`` renamed aside (``.<name>.old<pid>``) and did not remove,
    newest first."""
    return sorted((p for p in path.parent.glob(f".{path.name}.old*") if (p / "meta.json").is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)


def _driver_json(d):
    s = str(d)
    return int(s) if s.lstrip("-").isdigit() else s
