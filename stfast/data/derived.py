"""What a run derives from its data (split indices, driver vocabulary, normalization statistics, route profile
and coverage grid), computed once per trips store and settings and kept with the store.

Each value is a file (JSON) or a folder of ``.npy`` arrays under ``<store>/derived/``, named
``<name>-<key>``, where ``key`` is a digest of the store's fingerprint (:mod:`stfast.data.fingerprint`), the
name, :data:`VERSION` and the settings that determine the value (a split's rule, fractions, days and seed;
the geo-conv kernel size, ...). So a value is found again exactly when the same trips are read with the same
settings, by every rank of a run and by ``evaluate`` / ``predict`` / ``serve`` after it; other settings or a
store converted again (another fingerprint) give another key, and a store converted again replaces its folder
whole (:mod:`stfast.data.store`), its derived values with it. Writes are atomic (a temporary name beside the
value, then :func:`os.replace`): concurrent ranks that compute the same value on a first run write the same
bytes, and a reader never sees a half-written file; files are fsynced before the rename. Arrays are read
memory-mapped: a 10 M-trip store's split indices are shared by the ranks' page cache, not copied into each.

Damage: a JSON value is sealed with the XXH3-64 checksum of its content, an arrays folder's ``arrays.json`` records
each array's checksum, dtype and shape (and is sealed itself), and every read checks them (about 10 GB/s). A value
that is damaged (truncated, flipped bits, a key missing or edited, two arrays swapped) is never used: it is computed
again, with a warning naming the file, and replaces the damaged one.

Trips that are not a store (a raw file read and preprocessed in the run), a view that is not one of a
store's named splits (:func:`mark`), or a store folder that cannot be written: the value is computed, not
kept, as before.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .durable import aside, dead_leftovers, fsync_dir, fsync_tree, os_error_line
from .integrity import CHECKSUM, DamagedError, checksum_differs, file_checksum, read_sealed, seal
from .store_checks import read_npy_header

log = logging.getLogger("stfast.data")

DERIVED = "derived"
VERSION = 2  # bump when a derived value's computation or format changes: old files are then not found (2: sealed)


def mark(view, settings: dict) -> None:
    """Record on ``view`` (a :class:`~stfast.data.trip_view.TripsView` of a store, e.g. a training split) the
    settings that select its trips, so that values derived from it are kept under them."""
    view.derived_settings = settings


def _where(trips, name: str, settings: dict) -> tuple[Path, str] | None:
    """(the store's derived folder, the value's file stem), or None when ``trips`` is not (a marked view of) a
    store."""
    base = getattr(trips, "base", None)
    if base is not None:  # a view: only one marked with its selection
        sel = getattr(trips, "derived_settings", None)
        if sel is None:
            return None
        settings = {"selection": sel, **settings}
        trips = base
    folder, fp = getattr(trips, "store_path", None), getattr(trips, "fingerprint", None)
    if folder is None or not fp:
        return None
    text = json.dumps({"fingerprint": fp, "name": name, "version": VERSION, "settings": settings},
                      sort_keys=True, default=str)
    return Path(folder) / DERIVED, f"{name}-{hashlib.blake2b(text.encode(), digest_size=10).hexdigest()}"


def _replaced(folder: Path, trips, name: str) -> bool:
    """Whether the store whose derived folder is ``folder`` is no longer the one ``trips`` (or their base) were read
    from: another ``stfast data convert --out`` replaced it meanwhile (its manifest has another fingerprint, or none).
    A value of the old trips is then not kept there (it would never be read: another key, but a store's worth of
    files left in the new store's folder)."""
    base = getattr(trips, "base", None)
    fp = getattr(trips if base is None else base, "fingerprint", None)
    try:
        m = json.loads((folder.parent / "manifest.json").read_text())
    except (OSError, ValueError):
        m = None
    if isinstance(m, dict) and m.get("fingerprint") == fp:
        return False
    log.debug("%s: replaced by another conversion: derived value %s not kept", folder.parent, name)
    return True


def kept(trips) -> bool:
    """True when values derived from ``trips`` are kept (a store, or a marked view of one: :func:`mark`)."""
    return _where(trips, "", {}) is not None


def _damaged(path: Path, e: DamagedError) -> None:
    log.warning("%s: a kept derived value is damaged (%s): not used, computed again", path, e.reason)


def _discard(path: Path) -> None:
    """Remove the damaged value ``path`` (file or folder): renamed aside first, so a reader never sees half of it."""
    gone = aside(path, "bad")
    try:
        os.replace(path, gone)
    except OSError:
        return
    if gone.is_dir():
        shutil.rmtree(gone, ignore_errors=True)
    else:
        gone.unlink(missing_ok=True)


def _remove_dead_temporaries(folder: Path) -> None:
    """Remove the temporary files and folders (``.NAME.tmpPID``) that writers of ``folder`` whose process is gone
    left (a convert or run killed while keeping a value): called before each value is kept and by verify."""
    for p in dead_leftovers(folder, ("tmp",), files=True):
        try:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            log.info("%s: removed, left by a process that was stopped while keeping a derived value", p)
        except OSError:  # a read-only store: left as it is
            pass


_missed: list[list[str]] = []  # the lists of the not_kept() blocks now open


@contextlib.contextmanager
def not_kept() -> Iterator[list[str]]:
    """A list that the block fills with the names of the values computed but not kept (a full disk, a read-only
    store), in the order computed: what ``stfast data convert`` says after deriving, not to claim a value it
    could not keep."""
    names: list[str] = []
    _missed.append(names)
    try:
        yield names
    finally:
        _missed.remove(names)


def _not_kept(folder: Path, name: str, e: OSError) -> None:
    """Say that value ``name`` could not be kept in ``folder``: a warning for a full disk (each later run computes it
    again, and convert's derive step did not do its work), at debug level for a read-only store (expected)."""
    for names in _missed:
        if name not in names:
            names.append(name)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        log.warning("%s: derived value %s not kept, computed again by each run: %s", folder, name,
                    os_error_line(e, "writing it failed"))
    else:
        log.debug("%s: derived value %s not kept (%s)", folder, name, e)


def read_json_value(path: Path):
    """The value kept in ``path`` (a sealed JSON record). Raises OSError when absent, DamagedError when damaged."""
    rec = read_sealed(path)
    if "value" not in rec:
        raise DamagedError(path, "no value in it")
    return rec["value"]


def cached_json(trips, name: str, settings: dict, compute: Callable[[], object]):
    """``compute()`` (a JSON-serializable value) for ``trips`` under ``settings``, read from the store's derived
    folder when kept there and intact, else computed and kept (module doc)."""
    where = _where(trips, name, settings)
    if where is None:
        return compute()
    path = where[0] / f"{where[1]}.json"
    try:
        return read_json_value(path)
    except OSError:
        pass
    except DamagedError as e:
        _damaged(path, e)
        _discard(path)
    value = compute()
    if _replaced(where[0], trips, name):
        return value
    _remove_dead_temporaries(where[0])
    tmp = aside(path, "tmp")
    try:
        where[0].mkdir(exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(seal({"name": name, "settings": settings, "value": value}), f, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(where[0])
    except OSError as e:  # a read-only store: computed each time, as before
        tmp.unlink(missing_ok=True)
        _not_kept(where[0], name, e)
    return value


def read_arrays(folder: Path) -> dict:
    """The arrays kept in ``folder`` (name → read-only memory-mapped array), each checked against the checksum,
    dtype and shape its sealed ``arrays.json`` records. Raises OSError when absent, DamagedError when damaged."""
    rec = read_sealed(folder / "arrays.json")
    files = rec.get("files")
    if not isinstance(files, dict) or list(files) != rec.get("arrays"):
        raise DamagedError(folder / "arrays.json", "no checksums of its arrays")
    out = {}
    for k, want in files.items():
        p = folder / f"{k}.npy"
        read_npy_header(p, want)
        if (got := file_checksum(p)) != want[CHECKSUM]:
            raise checksum_differs(p, got, want[CHECKSUM])
        out[k] = np.load(p, mmap_mode="r", allow_pickle=False)
    return out


def cached_arrays(trips, name: str, settings: dict, compute: Callable[[], dict]) -> dict:
    """``compute()`` (a dict of name → numpy array) for ``trips`` under ``settings``, read memory-mapped from
    the store's derived folder when kept there and intact, else computed and kept (module doc)."""
    where = _where(trips, name, settings)
    if where is None:
        return compute()
    folder = where[0] / where[1]
    try:
        return read_arrays(folder)
    except OSError:
        pass
    except DamagedError as e:
        _damaged(folder, e)
        _discard(folder)
    value = compute()
    if _replaced(where[0], trips, name):
        return value
    _remove_dead_temporaries(where[0])
    tmp = aside(folder, "tmp")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        files = {}
        for k, a in value.items():
            p = tmp / f"{k}.npy"
            np.save(p, np.ascontiguousarray(a), allow_pickle=False)
            a = np.load(p, mmap_mode="r")
            files[k] = {CHECKSUM: file_checksum(p), "dtype": np.lib.format.dtype_to_descr(a.dtype),
                        "shape": list(a.shape)}
        rec = seal({"name": name, "settings": settings, "arrays": list(value), "files": files})
        (tmp / "arrays.json").write_text(json.dumps(rec, default=str))
        fsync_tree(tmp)
        try:
            os.rename(tmp, folder)
            fsync_dir(where[0])
        except OSError:  # another rank kept it first (the same arrays)
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _not_kept(where[0], name, e)
    return value


SPLITS = ("train", "val", "test")


def split_views(trips, settings: dict, compute: Callable[[], tuple]) -> tuple:
    """The train / validation / test views of ``trips`` whose indices ``compute()`` gives (three [T_k] int
    arrays) under ``settings`` (the split's rule, fractions, days, seed): kept with a store and read
    memory-mapped, each view marked (:func:`mark`) so that what is derived from it is kept too."""
    got = cached_arrays(trips, "split", settings, lambda: dict(zip(SPLITS, compute())))
    views = tuple(trips.view(got[k]) for k in SPLITS)
    if getattr(trips, "base", None) is None:  # views of a store itself (of a view: another selection)
        for k, v in zip(SPLITS, views):
            mark(v, {"split": settings, "part": k})
    return views


def verify_derived(store: str | os.PathLike) -> tuple[int, list[DamagedError]]:
    """Check every value kept in ``store``'s derived folder (as a read would); the damaged ones are removed (the next
    run that needs one computes it again). Returns (values found intact, the damage found, one error each)."""
    folder = Path(store) / DERIVED
    ok, bad = 0, []
    _remove_dead_temporaries(folder)
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    for p in entries:
        if p.name.startswith("."):  # another process's temporary
            continue
        try:
            read_arrays(p) if p.is_dir() else read_json_value(p)
            ok += 1
        except DamagedError as e:
            bad.append(e)
            _discard(p)
        except OSError as e:
            bad.append(DamagedError(p, f"cannot be read: {e.strerror or e}"))
            _discard(p)
    return ok, bad
