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
bytes, and a reader never sees a half-written file. Arrays are read memory-mapped: a 10 M-trip store's split
indices are shared by the ranks' page cache, not copied into each.

Trips that are not a store (a raw file read and preprocessed in the run), a view that is not one of a
store's named splits (:func:`mark`), or a store folder that cannot be written: the value is computed, not
kept, as before.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

log = logging.getLogger("stfast.data")

DERIVED = "derived"
VERSION = 1  # bump when a derived value's computation changes: old files are then not found


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


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def cached_json(trips, name: str, settings: dict, compute: Callable[[], object]):
    """``compute()`` (a JSON-serializable value) for ``trips`` under ``settings``, read from the store's derived
    folder when kept there, else computed and kept (module doc)."""
    where = _where(trips, name, settings)
    if where is None:
        return compute()
    path = where[0] / f"{where[1]}.json"
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError):
        pass
    value = compute()
    try:
        where[0].mkdir(exist_ok=True)
        tmp = _tmp(path)
        tmp.write_text(json.dumps({"name": name, "settings": settings, "value": value}, default=str))
        os.replace(tmp, path)
    except OSError as e:  # a read-only store: computed each time, as before
        log.debug("%s: derived value %s not kept (%s)", where[0], name, e)
    return value


def cached_arrays(trips, name: str, settings: dict, compute: Callable[[], dict]) -> dict:
    """``compute()`` (a dict of name → numpy array) for ``trips`` under ``settings``, read memory-mapped from
    the store's derived folder when kept there, else computed and kept (module doc)."""
    where = _where(trips, name, settings)
    if where is None:
        return compute()
    folder = where[0] / where[1]
    try:
        names = json.loads((folder / "arrays.json").read_text())["arrays"]
        return {k: np.load(folder / f"{k}.npy", mmap_mode="r", allow_pickle=False) for k in names}
    except (OSError, ValueError, KeyError):
        pass
    value = compute()
    tmp = _tmp(folder)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for k, a in value.items():
            np.save(tmp / f"{k}.npy", np.ascontiguousarray(a), allow_pickle=False)
        (tmp / "arrays.json").write_text(json.dumps({"name": name, "settings": settings, "arrays": list(value)},
                                                    default=str))
        try:
            os.rename(tmp, folder)
        except OSError:  # another rank kept it first (the same arrays)
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        log.debug("%s: derived value %s not kept (%s)", where[0], name, e)
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
