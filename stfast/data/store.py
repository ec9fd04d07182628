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
fsynced and renamed into place only when complete (:func:`stfast.data.durable.replace_folder`): an interrupted
conversion leaves no half store, and a crash while an old store is swapped for the new one is undone by the next
open. The fingerprint (:func:`stfast.data.fingerprint.trips_fingerprint`) is computed once, when the store is
finished, and read from the manifest afterwards.

Damage: the manifest records each file's XXH3-64 checksum, dtype and shape, and value checks that held at
conversion (:mod:`stfast.data.store_checks`); the manifest itself is sealed (:func:`stfast.data.integrity.seal`).
Every open checks the files' .npy headers and sizes against it; a file whose stamp (size, mtime, inode, ctime)
differs from the one ``checked.json`` recorded when it was last found intact is hashed and its values checked
before use (``stfast data verify`` checks every file). A damaged store raises
:class:`~stfast.data.integrity.DamagedError` naming the file.

``--out`` is replaced only when it is a store and holds nothing else (:func:`check_out`): stfast deletes only what
it wrote.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
from pathlib import Path

import numpy as np

from .derived import DERIVED
from .durable import (aside, atomic_file, dead_leftovers, fsync_file, recover_folder, refuse_under_a_file,
                      replace_folder)
from .fingerprint import compute_fingerprint
from .integrity import CHECKSUM, DamagedError, file_checksum, seal, unseal
from .preprocess_config import PreprocessConfig
from .store_checks import check_changed, file_record, read_npy_header, value_record
from .trips import DroppedTrips, Trips, lengths_to_offsets

log = logging.getLogger("stfast.data")

STORE_FORMAT = "stfast-trips-store/1"
MANIFEST = "manifest.json"
_STR_FIELDS = ("driver", "trip_id")
_HEADER_BYTES = 128  # fixed .npy header size, so a column's length is written in place when known
_STR_CHUNK = 1 << 20  # string values rewritten at a time when a store is finished


def is_store(path) -> bool:
    """True when ``path`` is a folder holding a trips store's ``manifest.json``. A store whose replacement by a
    conversion that died midway left it renamed aside is renamed back first (:func:`~stfast.data.durable.recover_folder`)."""
    if path is None:
        return False
    recover_folder(Path(path), _only_store_files)
    return (Path(path) / MANIFEST).is_file()


def _store_entries() -> frozenset:
    """The names a store folder holds (all written by stfast)."""
    return frozenset({MANIFEST, CHECKED, DERIVED, *(f"{c}.npy" for c in (*_COLUMNS, *_DROPPED))})


def _only_store_files(folder: Path) -> bool:
    """Whether ``folder`` is a store with nothing else in it (what stfast may delete or rename)."""
    try:
        return (folder / MANIFEST).is_file() and {p.name for p in folder.iterdir()} <= _store_entries()
    except OSError:
        return False


_TMP_FILE = re.compile(r"^(_lengths\.npy|_(driver|trip_id)\.\d+\.npy|\.checked\.json\.tmp\d+)$")
_SPILL_FILE = re.compile(r"^\d+\.bin$")


def _only_temporary_files(folder: Path) -> bool:
    """Whether ``folder`` holds only what a conversion's temporary or spill folder holds."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    return all(n in _store_entries() or _TMP_FILE.match(n) or _SPILL_FILE.match(n) for n in names)


def check_out(out: str | os.PathLike) -> Path:
    """The folder a conversion with ``--out out`` writes: ``out``, or where it points when it is a symbolic link (the
    link is kept, its target replaced). Refuses (ValueError, one line saying why) unless that is new, an empty folder,
    or a trips store holding nothing but a store's files: stfast deletes nothing it did not write; a mount point
    (a bind mount's folder: no rename replaces it) is refused naming a folder inside it."""
    out = Path(out)
    if out.is_symlink():
        out = Path(os.path.realpath(out))
    refuse_under_a_file(out)
    if not os.path.lexists(out):
        recover_folder(out, _only_store_files)  # a store a stopped conversion left aside comes back, to be replaced
    if not os.path.lexists(out):
        return out
    if os.path.ismount(out):  # the rename that puts the new store in place would fail (EBUSY) after all the work
        raise ValueError(f"--out {out} is a mount point, which a conversion cannot replace (it writes the store beside "
                         f"it, then renames it into place): write to a folder inside it (--out {out / 'store'}) or to "
                         "a new path")
    if not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder: choose a new folder for the trips store (or a .jsonl "
                         "file for DeepTTE JSON lines)")
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return out
    if MANIFEST not in names:
        raise ValueError(f"--out {out} exists and is not a trips store (it holds {names[0]!r} and no {MANIFEST}): "
                         "stfast replaces only a store it wrote; choose a new folder")
    try:
        read_manifest(out)
    except ValueError:
        raise ValueError(f"--out {out} holds a {MANIFEST} that is not a stfast trips store's: stfast replaces only a "
                         "store it wrote; choose a new folder") from None
    others = [n for n in names if n not in _store_entries()]
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise ValueError(f"--out {out} holds a trips store and {others[0]!r}{more}, which stfast did not write: "
                         f"replacing the store would delete them; move them out of {out}, or choose a new folder")
    return out


def remove_dead_leftovers(parent: Path) -> None:
    """Remove the temporary and spill folders (``.NAME.tmpPID``, ``.NAME.spillPID``) that conversions into ``parent``
    whose process is gone (killed) left, when they hold only what a conversion writes."""
    for p in dead_leftovers(parent, ("tmp", "spill")):
        if _only_temporary_files(p):
            shutil.rmtree(p, ignore_errors=True)
            log.info("%s: removed, left by a conversion that was stopped", p)


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
        out: the store folder to make (a symbolic link: its target). An existing store there is replaced when the new
            one is complete; anything else there is refused (:func:`check_out`), so no data of the user's is deleted.
            Temporary folders that stopped conversions into the same parent left are removed.
        source: what the store was made from, recorded in the manifest (e.g. ``{"data": path, "format": fmt}``).

    Raises:
        ValueError: ``out`` exists and is not a trips store, or holds other files. OSError on write failures.
    """

    def __init__(self, out: str | os.PathLike, source: dict | None = None):
        self.out = check_out(out)
        self.source = source or {}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_leftovers(self.out.parent)
        self.tmp = aside(self.out, "tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
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
        trips = _open(self.tmp, manifest)
        files = {p.name: file_record(p) for p in sorted(self.tmp.iterdir())}
        manifest.update(n_trips=len(trips), n_points=trips.n_points, fingerprint=compute_fingerprint(trips),
                        columns={n: files[f"{n}.npy"]["dtype"] for n in _COLUMNS}, files=files,
                        checks=value_record(trips))
        del trips
        _write_json(self.tmp / MANIFEST, seal(manifest))
        _record_checked(self.tmp, files)
        replace_folder(self.tmp, self.out)
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
_DROPPED = tuple(f"dropped_{c}" for c in ("trip_id", "segment", "reason"))
CHECKED = "checked.json"  # the stamps of the files as last found intact (store_checks.check_changed)
_warned_unrecorded: set = set()  # stores whose check could be kept nowhere (warned once per process)


def _fix(store, m: dict | None = None) -> str:
    """What to do about a damaged store: convert again (from the raw data its manifest names, where it does)."""
    raw = ((m or {}).get("source") or {}).get("data")
    return f"convert the data again (stfast data convert --data {raw or 'RAW'} --out {store})"


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _checked_records(folder: Path, temp: bool = True) -> list[Path]:
    """Where the stamps of ``folder``'s files as last found intact are kept: its ``checked.json``, and for a store
    this user cannot write into (a read-only mount, another user's folder) a file in the user's cache
    (``$XDG_CACHE_HOME`` or ``~/.cache``, ``stfast/checked/``) named by the store's absolute path; without one a
    read-only store of 10 M trips was hashed again (~2 s) at every open. Last, where neither can be written, this
    user's own folder in the temporary folder (:func:`_private_temp`), when it exists (and ``temp``)."""
    places = [folder / CHECKED]
    given = os.environ.get("XDG_CACHE_HOME", "")
    try:  # a relative XDG_CACHE_HOME is invalid (the XDG spec): ignored
        base = Path(given) if os.path.isabs(given) else Path.home() / ".cache"
    except RuntimeError:  # no home directory to find
        base = None
    if base is not None:
        places.append(base / "stfast" / "checked" / _record_name(folder))
    temp = _private_temp(create=False) if temp else None
    return places + ([temp / "checked" / _record_name(folder)] if temp is not None else [])


def _record_name(folder: Path) -> str:
    return f"{hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:32]}.json"


def _private_temp(create: bool) -> Path | None:
    """This user's own folder in the system's temporary folder (``stfast-UID``, mode 0700; made when ``create``),
    the last place a store's check is kept: None where it is missing, not a folder, or not this user's alone
    (another user could write records there that skip the checks)."""
    d = Path(tempfile.gettempdir()) / f"stfast-{os.getuid()}"
    try:
        if create:
            d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return None
    return d if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077 else None


def _record_checked(folder: Path, files: dict) -> None:
    """Keep the stamps of ``folder``'s ``files`` now (found intact) in the first of :func:`_checked_records` that
    can be written (this user's temporary folder made for it where the others cannot). Best effort: where none
    can, the store is checked again at its next open."""
    from .integrity import stamp

    stamps = {n: stamp(folder / n) for n in files}
    places = _checked_records(folder, temp=False)
    for place in [*places, None]:
        if place is None:  # the last resort, made now: a store and a cache that cannot be written
            temp = _private_temp(create=True)
            if temp is None:
                break
            place = temp / "checked" / _record_name(folder)
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(place, "w") as f:
                json.dump(stamps, f, indent=1)
            return
        except OSError as e:
            log.debug("%s: %s not written (%s)", folder, place, e)
            why = e.strerror or str(e)
    if str(folder) not in _warned_unrecorded:  # else every open checks the whole store again, silently
        _warned_unrecorded.add(str(folder))
        log.warning("%s: its check could not be recorded (%s: %s), so every open checks its files again; make the "
                    "store or that cache folder writable, or set XDG_CACHE_HOME to a writable folder", folder,
                    places[-1], why)


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of the store at ``path``, its seal checked (a manifest written before stfast sealed it is read
    as it is). Raises ValueError when it is none (or of another format), DamagedError when it was changed."""
    p = Path(path) / MANIFEST
    try:
        m = json.loads(p.read_bytes())
    except FileNotFoundError as e:
        raise ValueError(f"{path} is not a trips store (cannot read {MANIFEST}: {e})") from None
    except (OSError, ValueError) as e:
        if not (p.is_file() and any(x.name.endswith(".npy") for x in Path(path).iterdir())):
            raise ValueError(f"{path} is not a trips store (cannot read {MANIFEST}: {e})") from None
        raise DamagedError(p, f"not JSON: {e}", _fix(path)) from None
    if not isinstance(m, dict) or m.get("format") != STORE_FORMAT:
        raise ValueError(f"{path}: {MANIFEST} is not of format {STORE_FORMAT} (got {m.get('format') if isinstance(m, dict) else m!r}); "
                         "convert the data again with `stfast data convert --out DIR`")
    if CHECKSUM in m or "files" in m:
        try:
            m = unseal(m, p)
        except DamagedError as e:
            raise DamagedError(p, e.reason, _fix(path, m)) from None
    return m


def open_store(path: str | os.PathLike) -> Trips:
    """The trips of the store at ``path``, memory-mapped read-only (nothing is read until touched).

    Returns:
        :class:`~stfast.data.trips.Trips` whose arrays are read-only ``np.memmap`` views of the columns
        (``driver`` and ``trip_id`` fixed-width unicode ``<U*``, not object), with the manifest's ``tz``,
        ``preprocess_config`` (a :class:`~stfast.data.preprocess.PreprocessConfig`, None for DeepTTE
        records), ``dropped`` counts, ``dropped_trips`` rows, ``fingerprint`` and ``store_path`` (the folder,
        absolute: where values derived from the trips are kept, :mod:`stfast.data.derived`).

    Damage (see the module doc) is found before any value is used: every open checks each file's .npy header and
    size against the manifest; files changed since they were last found intact are hashed and their values checked.

    Raises:
        ValueError: ``path`` is not a complete store of format :data:`STORE_FORMAT`.
        DamagedError (a ValueError): a file of the store is damaged; the message names it.
    """
    path = Path(path)
    is_store(path)  # a store a stopped conversion left aside is renamed back
    m = read_manifest(path)
    try:
        trips = _open(path, m)
        check_changed(path, m, trips, _checked_records(path), _record_checked)
    except DamagedError as e:
        raise DamagedError(e.path, e.reason, _fix(path, m)) from None
    trips.store_path = str(path.resolve())  # where values derived from it are kept (stfast.data.derived)
    return trips


def verify_store(path: str | os.PathLike) -> tuple[int, int]:
    """Check every file of the store at ``path``: headers, values and checksums (:func:`open_store` checks only
    those changed since they were last found intact). Returns (files, bytes) checked.

    Raises:
        ValueError: ``path`` is not a trips store, or one without checksums (converted by an older stfast).
        DamagedError (a ValueError): the first damaged file, named.
    """
    from .store_checks import verify_files

    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder: give the folder `stfast data convert --out` wrote")
    if not is_store(path):
        raise ValueError(f"{path} is not a trips store (no {MANIFEST}): give the folder `stfast data convert --out` wrote")
    m = read_manifest(path)
    try:
        trips = _open(path, m)
        got = verify_files(path, m, trips)
    except DamagedError as e:
        raise DamagedError(e.path, e.reason, _fix(path, m)) from None
    _record_checked(path, m["files"])
    return got


def _open(path: Path, m: dict) -> Trips:
    """The columns of the store at ``path`` memory-mapped, each .npy header and file size checked against the
    manifest ``m`` where it records them (DamagedError naming the file)."""
    files, dtypes = m.get("files") or {}, m.get("columns") or {}

    def col(name):
        p = path / f"{name}.npy"
        want = files.get(p.name) or ({"dtype": dtypes[name]} if name in dtypes else {})
        read_npy_header(p, want)
        try:
            return np.load(p, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise DamagedError(p, f"cannot be read: {e}") from None

    kw = {name: col(name) for name in _COLUMNS}
    rows = DroppedTrips(*(col(c) for c in _DROPPED))
    if m.get("n_points") is not None and (len(kw["offsets"]) == 0 or int(kw["offsets"][-1]) != m["n_points"]):
        raise DamagedError(path / "offsets.npy", f"its last offset is not the manifest's n_points {m['n_points']}")
    cfg = m.get("preprocess_config")
    if cfg is not None:
        cfg = PreprocessConfig.from_dict(cfg)
    try:
        return Trips(**kw, dropped=dict(m.get("dropped", {})), dropped_trips=rows, tz=m.get("tz"),
                     preprocess_config=cfg, fingerprint=m.get("fingerprint"))
    except ValueError as e:  # offsets not monotone, or columns of other lengths than the offsets say
        raise DamagedError(path / "offsets.npy", str(e)) from None


def write_store(trips: Trips, out: str | os.PathLike, source: dict | None = None) -> Trips:
    """Write ``trips`` (all in memory) as a store at ``out`` (see :class:`StoreWriter`); returns it opened."""
    with StoreWriter(out, source) as w:
        w.append(trips)
        return w.finish()
