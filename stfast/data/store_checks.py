"""The checks that find a damaged trips store (:mod:`stfast.data.store`) before its values are used.

At conversion the manifest records, per file, its size, XXH3-64 checksum, dtype and shape (:func:`file_record`),
and each numeric column's range (:func:`value_record`). Then:

- every open reads each file's .npy header and size (:func:`read_npy_header`): a file truncated (to 0 bytes too),
  extended or with another dtype or shape in its header is found at once, for microseconds; the offsets are
  checked to be monotone and to end at the number of points (:class:`~stfast.data.trips.Trips`);
- an open after a file changed (its :func:`~stfast.data.integrity.stamp` differs from the one recorded when it was
  last found intact) checks that file's values and checksum (:func:`check_changed`), then records the stamps;
- ``stfast data verify`` checks every file (:func:`verify_files`).

Value checks (first) name the value and where it is (``lng.npy: 2944.17 at point 1032 is outside 103.77..104.61,
the range at conversion``: gross damage such as an exponent bit flipped or lng and lat swapped); checksums catch
what value checks cannot (a flipped low bit, two valid values swapped).
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .cores import usable_cores
from .integrity import CHECKSUM, DamagedError, checksum_differs, file_checksum, stamp

log = logging.getLogger("stfast.data")

_CHUNK = 1 << 22  # values scanned at a time: memory stays flat on a store of any size
_NUMERIC = ("lng", "lat", "state", "time_gap", "dist_gap", "dist", "time", "week_id", "time_id", "date_id", "segment")
_warned_unchecked: set = set()


def read_npy_header(path: Path, want: dict) -> None:
    """Check the .npy file ``path``: a readable header, a size that matches it, and the dtype (``want["dtype"]``,
    a numpy descr such as ``"<f8"``) and shape (``want["shape"]``) the manifest records, where given.

    Raises:
        DamagedError: naming ``path`` and what differs (missing, empty, truncated, another dtype or shape).
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            start = f.tell()
    except FileNotFoundError:
        raise DamagedError(path, "the file is missing") from None
    except (OSError, ValueError, EOFError) as e:
        raise DamagedError(path, "an empty file" if not os.path.exists(path) or os.path.getsize(path) == 0
                           else f"not a readable .npy header: {e}") from None
    descr = np.lib.format.dtype_to_descr(dtype)
    if "dtype" in want and descr != want["dtype"]:
        raise DamagedError(path, f"its header says dtype {descr}, the manifest {want['dtype']}")
    if "shape" in want and list(shape) != list(want["shape"]):
        raise DamagedError(path, f"its header says shape {tuple(shape)}, the manifest {tuple(want['shape'])}")
    need = start + math.prod(shape) * dtype.itemsize
    if size != need:
        raise DamagedError(path, f"{size} bytes where its header says {need}: truncated or extended")


def file_record(path: Path) -> dict:
    """What the manifest records of one file: ``bytes``, checksum (:data:`~stfast.data.integrity.CHECKSUM`) and,
    for a .npy file, ``dtype`` (descr) and ``shape`` (list)."""
    rec = {"bytes": os.path.getsize(path), CHECKSUM: file_checksum(path)}
    if path.suffix == ".npy":
        a = np.load(path, mmap_mode="r", allow_pickle=False)
        rec.update(dtype=np.lib.format.dtype_to_descr(a.dtype), shape=list(a.shape))
    return rec


def _min_max(a: np.ndarray) -> tuple[float, float]:
    """(min, max) of ``a`` in slices (NaN when any value is NaN); (inf, -inf) when empty."""
    lo, hi = math.inf, -math.inf
    for s in range(0, len(a), _CHUNK):
        part = a[s:s + _CHUNK]
        lo, hi = min(lo, part.min()), max(hi, part.max())  # min/max propagate NaN
        if math.isnan(lo) or math.isnan(hi):
            return math.nan, math.nan
    return lo, hi


def value_record(trips) -> dict:
    """What held of ``trips``' values at conversion: ``ranges`` (column → [min, max], for numeric columns without
    NaN)."""
    ranges = {}
    for name in _NUMERIC:
        a = getattr(trips, name)
        lo, hi = _min_max(a)
        if len(a) and not math.isnan(lo):
            ranges[name] = [lo.item(), hi.item()]
    return {"ranges": ranges}


def _workers() -> int:
    """Threads for the checks: the cores this process may use (hashing and numpy's comparisons release the GIL)."""
    return usable_cores()


def _in_order(tasks: list[Callable[[], None]]) -> None:
    """Run ``tasks`` on :func:`_workers` threads; the first task's error in list order is raised (as when they run
    one after another), once the tasks running then have ended; tasks not started by then are not run (every
    task before the failed one has ended without error, so no later error could be the one raised)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(_workers(), max(len(tasks), 1))) as ex:
        futures = [ex.submit(t) for t in tasks]
        try:
            for f in futures:
                f.result()
        except BaseException:
            ex.shutdown(wait=True, cancel_futures=True)
            raise


def _range_check(folder: Path, trips, name: str, lo, hi) -> None:
    a = getattr(trips, name)
    for s in range(0, len(a), _CHUNK):
        part = np.asarray(a[s:s + _CHUNK])
        if len(part) and part.min() >= lo and part.max() <= hi:  # two passes, no temporaries (NaN fails)
            continue
        bad = np.flatnonzero(~((part >= lo) & (part <= hi)))
        if len(bad):
            unit = "point" if name in trips._POINT_FIELDS else "trip"
            raise DamagedError(folder / f"{name}.npy", f"{part[bad[0]]} at {unit} {s + bad[0]} is outside "
                               f"{lo}..{hi}, the range at conversion")


def _value_tasks(folder: Path, trips, checks: dict, names) -> list[Callable[[], None]]:
    cols = {n[:-4] for n in names if n.endswith(".npy")}
    return [lambda name=name, lo=lo, hi=hi: _range_check(folder, trips, name, lo, hi)
            for name, (lo, hi) in checks.get("ranges", {}).items() if name in cols]


def _hash_tasks(folder: Path, files: dict, names) -> list[Callable[[], None]]:
    def check(n):
        got = file_checksum(folder / n)
        if got != files[n][CHECKSUM]:
            raise checksum_differs(folder / n, got, files[n][CHECKSUM], "at conversion")
    return [lambda n=n: check(n) for n in names]


def check_files(folder: Path, trips, m: dict, names) -> None:
    """Check the files ``names`` of the store at ``folder`` (manifest ``m``, opened as ``trips``): the values of each
    column against what held at conversion (its range, :func:`value_record`), then each file's checksum, on every core at once. Raises DamagedError naming the
    first damaged file in that order (a value error before any checksum's)."""
    _in_order(_value_tasks(folder, trips, m.get("checks", {}), names) + _hash_tasks(folder, m["files"], names))


def check_changed(folder: Path, m: dict, trips, records: list[Path], record: Callable[[Path, dict], None]) -> None:
    """Check the files of the store at ``folder`` (manifest ``m``, opened as ``trips``) that changed since they were
    last found intact: their stamps match none of those kept in ``records`` (JSON files {name: stamp}; missing or
    unreadable ones count as empty). Their values and checksums are checked (:func:`check_files`), then
    ``record(folder, files)`` keeps the new stamps. A store without checksums (converted before stfast recorded
    them) is opened with a warning, once.

    Raises:
        DamagedError: a changed file is damaged (the message names it).
    """
    import json

    files = m.get("files")
    if not files:
        if str(folder) not in _warned_unchecked:
            _warned_unchecked.add(str(folder))
            log.warning("%s: a trips store without checksums (converted by an older stfast): damage cannot be "
                        "detected; convert the data again to have it checked", folder)
        return
    seen = []
    for place in records:
        try:
            kept = json.loads(place.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(kept, dict):
            seen.append(kept)
    try:
        stamps = {n: stamp(folder / n) for n in files}
    except FileNotFoundError as e:
        raise DamagedError(e.filename, "the file is missing") from None
    changed = [n for n in files if all(s.get(n) != stamps[n] for s in seen)]
    if not changed:
        return
    t0 = time.perf_counter()
    check_files(folder, trips, m, changed)
    record(folder, files)
    size = sum(files[n]["bytes"] for n in changed)
    # found intact, so their contents did not change: only their stamps did (a copy, a move, a touch, a chmod -R)
    why = "checked again, their stamps not those of their last check" if seen else \
        "checked (no earlier check recorded)"
    log.info("%s: %d files %s (%.2f GB): intact (%.1f s)", folder, len(changed), why, size / 1e9,
             time.perf_counter() - t0)


def verify_files(folder: Path, m: dict, trips) -> tuple[int, int]:
    """Check every file of the store at ``folder`` (manifest ``m``, opened as ``trips``): values and checksums.
    Returns (files, bytes) checked. Raises DamagedError naming the first damaged file, ValueError for a store
    without checksums."""
    files = m.get("files")
    if not files:
        raise ValueError(f"{folder}: a trips store without checksums (converted by an older stfast): convert the "
                         "data again to have them")
    check_files(folder, trips, m, sorted(files))
    return len(files), sum(f["bytes"] for f in files.values())
