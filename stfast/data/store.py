"""A trips store: preprocessed trips on disk as one folder of memory-mapped columns plus ``manifest.json``.

Layout of a store folder (format :data:`STORE_FORMAT`)::

    manifest.json        format, n_trips, n_points, tz, preprocess_config, dropped counts, fingerprint,
                         source (the raw input and its format), columns (name → dtype)
    offsets.npy          [T + 1] int64 CSR offsets (trip i owns points offsets[i]:offsets[i+1])
    lng.npy lat.npy ...  [N] point columns (lng, lat, time_gap, dist_gap float64; state float32)
    dist.npy time.npy    [T] trip columns (float64), week_id, time_id, date_id, segment (int64),
    driver.npy           [T] fixed-width unicode (``<U*``), trip_id.npy likewise
    dropped_*.npy        the :class:`~stfast.data.trips.DroppedTrips` rows (trip_id, segment, reason)

Why numpy ``.npy`` and not Arrow/Parquet: ``np.load(mmap_mode="r")`` gives the numpy arrays every layer
of stfast already consumes, with no conversion and no copy; opening maps the files (pages are read when
touched), so opening costs milliseconds whatever the size, and the ranks of ``--nproc N`` on one machine
share the pages of the OS page cache instead of holding copies. Arrow would add a conversion of its
string columns to numpy on every open and buys nothing here (one writer, numeric columns).

A store is written by :class:`StoreWriter` chunk by chunk (a streaming conversion appends preprocessed
trips as they are made, :mod:`stfast.data.convert`), into a temporary folder beside ``out`` that is
renamed into place only when complete: an interrupted conversion leaves no half store. The fingerprint
(:func:`stfast.data.fingerprint.trips_fingerprint`) is computed once, when the store is finished, and read
from the manifest afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

from .fingerprint import compute_fingerprint
from .trips import DroppedTrips, Trips, lengths_to_offsets

STORE_FORMAT = "stfast-trips-store/1"
MANIFEST = "manifest.json"
_STR_FIELDS = ("driver", "trip_id")
_HEADER_BYTES = 128  # fixed .npy header size, so a column's length is written in place when known
_STR_CHUNK = 1 << 20  # string values rewritten at a time when a store is finished


def is_store(path) -> bool:
    """True when ``path`` is a folder holding a trips store's ``manifest.json``."""
    return path is not None and (Path(path) / MANIFEST).is_file()


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """A version-1.0 .npy header of exactly :data:`_HEADER_BYTES` bytes for a 1-D array of ``n`` ``dtype``."""
    d = "{'descr': %r, 'fortran_order': False, 'shape': (%d,), }" % (np.lib.format.dtype_to_descr(dtype), n)
    body = d.ljust(_HEADER_BYTES - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


class _Column:
    """One numeric column appended to in pieces, its .npy header completed at :meth:`close`."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self.f = open(path, "wb")
        self.f.write(_npy_header(self.dtype, 0))

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        self.f.write(a.data)
        self.n += len(a)

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, self.n))
        self.f.close()


class StoreWriter:
    """Write a trips store at ``out`` from chunks of :class:`~stfast.data.trips.Trips` (use as a context
    manager: leaving it by an exception removes the temporary folder and leaves ``out`` as it was).

    Args:
        out: the store folder to make. An existing store there is replaced when the new one is complete;
            anything else there is refused (ValueError), so no data of the user's is overwritten.
        source: what the store was made from, recorded in the manifest (e.g. ``{"data": path, "format": fmt}``).

    Raises:
        ValueError: ``out`` exists and is not a trips store. OSError on write failures.
    """

    def __init__(self, out: str | os.PathLike, source: dict | None = None):
        self.out = Path(out)
        if self.out.exists() and not is_store(self.out):
            raise ValueError(f"--out {self.out} exists and is not a trips store: choose a new folder "
                             "(or a .jsonl file for DeepTTE JSON lines)")
        self.source = source or {}
        self.tmp = self.out.with_name(f".{self.out.name}.tmp{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.cols = {name: _Column(self.tmp / f"{name}.npy", dt) for name, dt in (
            ("lng", np.float64), ("lat", np.float64), ("state", np.float32), ("time_gap", np.float64),
            ("dist_gap", np.float64), ("dist", np.float64), ("time", np.float64), ("week_id", np.int64),
            ("time_id", np.int64), ("date_id", np.int64), ("segment", np.int64))}
        self.lengths = _Column(self.tmp / "_lengths.npy", np.int64)
        self.str_parts: dict[str, list[Path]] = {k: [] for k in _STR_FIELDS}
        self.dropped: dict[str, int] = {}
        self.dropped_trips: list[DroppedTrips] = []
        self.tz = self.preprocess_config = None
        self.n_chunks = self.n_trips = 0

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def append(self, trips: Trips) -> None:
        """Add ``trips`` (after those appended before); their ``dropped`` counts and rows are added too, their
        ``tz`` and ``preprocess_config`` recorded (the last chunk's)."""
        for name, col in self.cols.items():
            col.append(getattr(trips, name))
        self.lengths.append(trips.lengths)
        for name in _STR_FIELDS:
            p = self.tmp / f"_{name}.{self.n_chunks}.npy"
            np.save(p, np.asarray(getattr(trips, name)).astype(str), allow_pickle=False)
            self.str_parts[name].append(p)
        for k, v in trips.dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + int(v)
        self.dropped_trips.append(trips.dropped_trips)
        self.tz, self.preprocess_config = trips.tz, trips.preprocess_config
        self.n_chunks += 1
        self.n_trips += len(trips)

    def add_dropped(self, dropped: dict, rows: DroppedTrips | None = None) -> None:
        """Counts (and rows) of what reading dropped outside any appended chunk."""
        for k, v in dropped.items():
            self.dropped[k] = self.dropped.get(k, 0) + int(v)
        if rows is not None:
            self.dropped_trips.append(rows)

    def finish(self) -> Trips:
        """Complete the columns, compute the fingerprint, write the manifest and rename the folder into place.
        Returns the store as opened by :func:`open_store`."""
        for col in self.cols.values():
            col.close()
        self.lengths.close()
        lengths = np.load(self.lengths.path, mmap_mode="r")
        off = np.lib.format.open_memmap(self.tmp / "offsets.npy", "w+", np.int64, (len(lengths) + 1,))
        off[:] = lengths_to_offsets(lengths)
        off.flush()
        del off, lengths
        self.lengths.path.unlink()
        for name, parts in self.str_parts.items():
            self._join_strings(name, parts)
        rows = DroppedTrips.concat(self.dropped_trips)
        for c in ("trip_id", "segment", "reason"):
            a = getattr(rows, c)
            np.save(self.tmp / f"dropped_{c}.npy", a.astype(str) if a.dtype == object else a, allow_pickle=False)
        cfg = self.preprocess_config
        manifest = {"format": STORE_FORMAT, "tz": self.tz, "dropped": self.dropped,
                    "preprocess_config": None if cfg is None else cfg.to_dict(), "source": self.source}
        (self.tmp / MANIFEST).write_text(json.dumps(manifest))
        trips = _open(self.tmp, manifest)
        manifest.update(n_trips=len(trips), n_points=trips.n_points, fingerprint=compute_fingerprint(trips),
                        columns={n: np.lib.format.dtype_to_descr(np.load(self.tmp / f"{n}.npy", mmap_mode="r").dtype)
                                 for n in _COLUMNS})
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        del trips
        old = self.out.with_name(f".{self.out.name}.old{os.getpid()}")
        if self.out.exists():
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        shutil.rmtree(old, ignore_errors=True)
        return open_store(self.out)

    def _join_strings(self, name: str, parts: list[Path]) -> None:
        """The per-chunk string pieces as one fixed-width column (the widest value's width)."""
        arrays = [np.load(p, mmap_mode="r") for p in parts]
        width = max([a.dtype.itemsize // 4 for a in arrays] + [1])
        out = np.lib.format.open_memmap(self.tmp / f"{name}.npy", "w+", f"<U{width}", (sum(map(len, arrays)),))
        at = 0
        for a in arrays:
            for s in range(0, len(a), _STR_CHUNK):
                piece = a[s:s + _STR_CHUNK]
                out[at:at + len(piece)] = piece
                at += len(piece)
        out.flush()
        del out, arrays
        for p in parts:
            p.unlink()

    def abort(self) -> None:
        """Close and remove the temporary folder (``out`` untouched)."""
        for col in [*self.cols.values(), self.lengths]:
            if not col.f.closed:
                col.f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


_COLUMNS = ("offsets", *Trips._POINT_FIELDS, *Trips._TRIP_FIELDS)


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the store at ``path``. Raises ValueError when it is none (or of another format)."""
    p = Path(path) / MANIFEST
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a trips store (cannot read {MANIFEST}: {e})") from None
    if not isinstance(m, dict) or m.get("format") != STORE_FORMAT:
        raise ValueError(f"{path}: {MANIFEST} is not of format {STORE_FORMAT} (got {m.get('format') if isinstance(m, dict) else m!r}); "
                         "convert the data again with `stfast data convert --out DIR`")
    return m


def open_store(path: str | os.PathLike) -> Trips:
    """The trips of the store at ``path``, memory-mapped read-only (nothing is read until touched).

    Returns:
        :class:`~stfast.data.trips.Trips` whose arrays are read-only ``np.memmap`` views of the columns
        (``driver`` and ``trip_id`` fixed-width unicode ``<U*``, not object), with the manifest's ``tz``,
        ``preprocess_config`` (a :class:`~stfast.data.preprocess.PreprocessConfig`, None for DeepTTE
        records), ``dropped`` counts, ``dropped_trips`` rows, ``fingerprint`` and ``store_path`` (the folder,
        absolute: where values derived from the trips are kept, :mod:`stfast.data.derived`).

    Raises:
        ValueError: ``path`` is not a complete store of format :data:`STORE_FORMAT`.
    """
    trips = _open(Path(path), read_manifest(path))
    trips.store_path = str(Path(path).resolve())  # where values derived from it are kept (stfast.data.derived)
    return trips


def _open(path: Path, m: dict) -> Trips:
    def col(name):
        return np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)

    try:
        kw = {name: col(name) for name in _COLUMNS}
        rows = DroppedTrips(*(col(f"dropped_{c}") for c in ("trip_id", "segment", "reason")))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: incomplete trips store ({e})") from None
    cfg = m.get("preprocess_config")
    if cfg is not None:
        from .preprocess import PreprocessConfig  # preprocess imports trips, not this module

        cfg = PreprocessConfig.from_dict(cfg)
    return Trips(**kw, dropped=dict(m.get("dropped", {})), dropped_trips=rows, tz=m.get("tz"),
                 preprocess_config=cfg, fingerprint=m.get("fingerprint"))


def write_store(trips: Trips, out: str | os.PathLike, source: dict | None = None) -> Trips:
    """Write ``trips`` (all in memory) as a store at ``out`` (see :class:`StoreWriter`); returns it opened."""
    with StoreWriter(out, source) as w:
        w.append(trips)
        return w.finish()
