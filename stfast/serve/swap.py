"""Hot swap: the service replaces its model while it runs, without dropping a request (issue 63 item 3).

A :class:`ServedModel` is immutable: a loaded model with what its requests are built with (route profile,
densification spacing), its version and when it was loaded. A request handler reads the current one ONCE
(:attr:`Reloader.current`), checks and builds its request with it, and carries it with its items into the batcher,
whose forward pass groups items by served model: a request is predicted by the model it was built with, and a
batch finishes on the model it started with, whatever happens meanwhile.

:class:`Reloader` loads a new checkpoint off the event loop (a thread), checks it (:func:`load_served`: the
file's own checks, its preprocessing and training area against the running model's, a smoke prediction) and
only then makes it current, in one assignment on the event loop. A refused model leaves the running one
answering and is said in ONE warning line on the ``stfast.serve`` logger (no file system path in it).

The version of a model is the first 12 hex digits of its checkpoint file's SHA-256: the same file gives the same
version on every machine and every load; any other file (another seed, another epoch) another.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.coverage import box_text
from ..data.routes import RouteProfile
from ..train.trained import TrainedModel

log = logging.getLogger("stfast.serve")

MIN_AREA_SHARE = 0.5
"""A new model must cover at least this share of the running model's training-area cells (another city's model,
or one trained on a far corner, would refuse most of the routes the running one answers)."""
WATCH_INTERVAL_S = 1.0
"""How often ``--watch`` looks at the checkpoint file's status (size, time, inode)."""


class Refused(ValueError):
    """A checkpoint that may not replace the running model: the message says why (one line, no path)."""


@dataclass(frozen=True, eq=False)
class ServedModel:
    """A model as the service serves it; never changed once made (the service swaps the whole object).

    Attributes:
        model: the loaded :class:`~stfast.train.trained.TrainedModel`.
        profile: its :class:`~stfast.data.routes.RouteProfile` (training area, default state), computed once.
        spacing_km: what its requests are densified to (:meth:`TrainedModel.densify_spacing_km`).
        version: the first 12 hex digits of the checkpoint file's SHA-256.
        parent: the version (or fingerprint) of the model it was fine-tuned from, when the checkpoint records one;
            else None.
        loaded_at: when it was loaded (Unix seconds).
    """

    model: TrainedModel
    profile: RouteProfile
    spacing_km: float
    version: str
    parent: str | None
    loaded_at: float

    @classmethod
    def of(cls, model: TrainedModel, version: str | None = None) -> "ServedModel":
        """``model`` served as it is (its version: the SHA-256 of the file at ``model.path`` unless given; a
        model whose file is gone gets its data fingerprint's first 12 hex digits, or ``"unknown"``)."""
        if version is None:
            try:
                version = file_version(model.path)[0]
            except OSError:
                version = (model.data_fingerprint or "")[:12] or "unknown"
        return cls(model, model.route_defaults(), model.densify_spacing_km(), version, parent_of(model), time.time())

    def loaded_iso(self) -> str:
        return dt.datetime.fromtimestamp(self.loaded_at, dt.timezone.utc).isoformat(timespec="seconds")


def parent_of(model: TrainedModel) -> str | None:
    """The parent a checkpoint records (a warm start's source: its ``parent`` entry, text or a dict with a
    ``version`` / ``sha256`` / ``fingerprint``), cut to 12 characters; None when it records none."""
    p = getattr(model, "parent", None)
    if isinstance(p, dict):
        p = p.get("version") or p.get("sha256") or p.get("fingerprint")
    return str(p)[:12] if p else None


def file_version(path: str | os.PathLike) -> tuple[str, tuple]:
    """(the first 12 hex digits of the file's SHA-256, its status signature (device, inode, size, mtime)) read from
    one open file. Raises OSError."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:12], stat_signature(st)


def stat_signature(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def contract_difference(old: ServedModel, new: TrainedModel, new_profile: RouteProfile) -> str | None:
    """Why ``new`` cannot answer the running model's requests, in words, or None: another preprocessing (a data
    option of the run — time zone, resampling spacing, gap, modes — or another preprocessing setting), or a
    training area that covers less than :data:`MIN_AREA_SHARE` of the running model's cells."""
    from ..train.config import flag, show

    a, b = old.model.data_options(), new.data_options()
    for k in a:
        if a[k] != b.get(k):
            try:
                words = f"{flag(k)} {show(k, b.get(k))} against the running model's {show(k, a[k])}"
            except (KeyError, TypeError, ValueError):
                words = f"{k} {b.get(k)!r} against the running model's {a[k]!r}"
            return f"other preprocessing: {words}"
    pa, pb = old.model.preprocess or {}, new.preprocess or {}
    for k in sorted(set(pa) | set(pb)):
        if pa.get(k) != pb.get(k):
            return f"other preprocessing: {k} {pb.get(k)!r} against the running model's {pa.get(k)!r}"
    oa, na = old.profile.area, new_profile.area
    if len(oa.cells):
        centres = (oa.cells + 0.5) * [oa.cell_lng, oa.cell_lat] + [oa.lng0, oa.lat0]
        share = float(np.mean(na.covers(centres[:, 0], centres[:, 1])))
        if share < MIN_AREA_SHARE:
            return (f"another area: its training area ({box_text(na.bbox)}) covers {100 * share:.0f} % of the running "
                    f"model's ({box_text(oa.bbox)}), less than {100 * MIN_AREA_SHARE:.0f} %")
    return None


def smoke_route(served_area, kernel_size: int) -> np.ndarray:
    """A short straight route (kernel_size + 2 points 50 m apart, northwards) from the centre of the middle cell
    of ``served_area``: inside the area by its margin."""
    c = served_area.cells[len(served_area.cells) // 2]
    lng = served_area.lng0 + (c[0] + 0.5) * served_area.cell_lng
    lat = served_area.lat0 + (c[1] + 0.5) * served_area.cell_lat
    n = max(kernel_size, 3) + 2
    return np.stack([np.full(n, lng), lat + np.arange(n) * 0.05 / 111.195], 1)


def load_versioned(path: str | os.PathLike, device: str = "cpu", precision: str | None = None,
                   tries: int = 3) -> tuple[TrainedModel, str]:
    """(:func:`~stfast.train.trained.load_model` of ``path``, its version): the file is hashed before and after it is
    loaded, and read again when it was replaced meanwhile (up to ``tries`` times), so the version is that of the
    bytes loaded. Raises what ``load_model`` raises; ValueError when the file kept changing."""
    from ..train.trained import load_model

    for _ in range(tries):
        try:
            version, sig = file_version(path)
        except OSError:
            load_model(path, device, precision)  # raises in its own words: no such file, a folder, …
            raise
        model = load_model(path, device, precision)
        if file_version(path)[1] == sig:
            return model, version
    raise ValueError(f"the checkpoint file changed {tries} times while it was read")


def load_served(path: str | os.PathLike, running: ServedModel | None, device: str = "cpu",
                precision: str | None = None, tries: int = 3) -> ServedModel:
    """The checkpoint at ``path`` loaded and checked to replace ``running`` (None: nothing to compare with): the
    file's own checks (:func:`~stfast.train.trained.load_model`: a truncated or corrupt file raises), its
    preprocessing and training area against ``running``'s (:func:`contract_difference`), and a smoke prediction of
    one short route inside its area (finite, positive). The file is hashed before and after loading; a file
    replaced meanwhile is read again (up to ``tries`` times). Runs in a worker thread.

    Raises:
        Refused: why, in one line that names no path.
    """
    path = Path(path)
    try:
        model, version = load_versioned(path, device, precision, tries)
    except Exception as e:  # noqa: BLE001 - anything: the running model keeps answering
        raise Refused(_no_path(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}", path)) from None
    try:
        profile, spacing = model.route_defaults(), model.densify_spacing_km()
    except Exception as e:  # noqa: BLE001
        text = str(e).replace(str(model.config.data), "its training data") if model.config.data else str(e)
        raise Refused(_no_path(f"it records no route profile and its training data cannot give one: {text}",
                               path)) from None
    if running is not None:
        why = contract_difference(running, model, profile)
        if why is not None:
            raise Refused(why)
    try:
        route = smoke_route(profile.area, model.norm_stats.kernel_size)
        secs = model.eta([route], [int(time.time())], densify=False)
    except Exception as e:  # noqa: BLE001
        raise Refused(_no_path(f"the smoke prediction failed: {type(e).__name__}: {e}", path)) from None
    if not (len(secs) == 1 and np.isfinite(secs[0]) and secs[0] > 0):
        raise Refused(f"the smoke prediction gave {secs[0] if len(secs) else 'nothing'} s for a "
                      f"{len(route)}-point route")
    return ServedModel(model, profile, spacing, version, parent_of(model), time.time())


def _no_path(text: str, path: Path) -> str:
    """``text`` (one line) with the checkpoint's path replaced by "the checkpoint" (logs and /healthz name no
    file)."""
    for p in sorted({str(path), str(path.resolve()), os.path.abspath(path)}, key=len, reverse=True):
        text = text.replace(f"checkpoint {p}", "the checkpoint").replace(p, "the checkpoint")
    for p in sorted({str(path.parent), str(path.resolve().parent)}, key=len, reverse=True):
        text = text.replace(p, "its folder")
    return " ".join(text.split())[:500]


class Reloader:
    """The served model and its replacement: :meth:`reload` (SIGHUP, ``POST /admin/reload``) and :meth:`watch`
    (``--watch``).

    Attributes:
        current: the :class:`ServedModel` answering new requests (read it once per request).
        swaps: models made current since the start; refusals: checkpoints refused.
        last_refusal: {"at": ISO time, "reason": ...} of the last refused reload, or None.
    """

    def __init__(self, served: ServedModel, path: str | os.PathLike, device: str = "cpu",
                 precision: str | None = None, watch_s: float | None = None):
        self.current, self.path, self.device, self.precision = served, Path(path), device, precision
        self.watch_s = watch_s
        self.swaps = self.refusals = 0
        self.last_refusal: dict | None = None
        self._lock: asyncio.Lock | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="stfast-reload")
        self._tasks: set = set()
        self._watch_task: asyncio.Task | None = None
        try:
            self._seen = stat_signature(os.stat(self.path))
        except OSError:
            self._seen = None

    async def reload(self, trigger: str) -> dict:
        """Load, check and (when it passes, and is another file than the current one) make current the checkpoint
        file, one reload at a time. Returns {"outcome": "swapped" | "unchanged" | "refused", "model": the current
        version, "swaps": ..., "reason": ... when refused}. Never raises for a bad checkpoint."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            loop = asyncio.get_running_loop()
            old = self.current
            try:
                self._seen = stat_signature(await loop.run_in_executor(self._pool, os.stat, self.path))
            except OSError:
                pass
            try:
                version = (await loop.run_in_executor(self._pool, file_version, self.path))[0]
            except OSError as e:
                return self._refuse(trigger, _no_path(f"{type(e).__name__}: {e.strerror or e}", self.path))
            if version == old.version:
                log.info("reload (%s): the checkpoint is model %s already; nothing to do", trigger, version)
                return {"outcome": "unchanged", "model": version, "swaps": self.swaps}
            try:
                new = await loop.run_in_executor(self._pool, load_served, self.path, old, self.device,
                                                 self.precision)
            except Refused as e:
                return self._refuse(trigger, str(e))
            except Exception as e:  # noqa: BLE001 - a fault of ours in checking must not stop the service
                return self._refuse(trigger, _no_path(f"{type(e).__name__}: {e}", self.path))
            if new.version == old.version:
                return {"outcome": "unchanged", "model": new.version, "swaps": self.swaps}
            self.current = new  # one assignment: requests that start from now on read it
            self.swaps += 1
            log.info("reload (%s): now serving model %s (was %s%s); %d swap%s", trigger, new.version, old.version,
                     f", parent {new.parent}" if new.parent else "", self.swaps, "" if self.swaps == 1 else "s")
            return {"outcome": "swapped", "model": new.version, "was": old.version, "swaps": self.swaps}

    def _refuse(self, trigger: str, reason: str) -> dict:
        self.refusals += 1
        self.last_refusal = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             "trigger": trigger, "reason": reason}
        log.warning("reload (%s) refused: %s; model %s keeps answering", trigger, reason, self.current.version)
        return {"outcome": "refused", "model": self.current.version, "swaps": self.swaps, "reason": reason}

    def trigger(self, why: str) -> None:
        """Start a reload from a signal handler or other callback on the event loop (its outcome is logged)."""
        task = asyncio.get_running_loop().create_task(self.reload(why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start(self) -> None:
        """Start watching the checkpoint file when ``watch_s`` is set (on the running event loop)."""
        if self.watch_s and (self._watch_task is None or self._watch_task.done()):
            self._watch_task = asyncio.get_running_loop().create_task(self.watch())

    async def stop(self) -> None:
        for t in [self._watch_task, *self._tasks]:
            if t is not None:
                t.cancel()
        self._watch_task = None

    async def watch(self) -> None:
        """Every ``watch_s`` seconds, the file's status (device, inode, size, modification time); a change (a
        new file renamed over it, or one written in place) reloads it. A refused file is not retried until it
        changes again."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                sig = stat_signature(await loop.run_in_executor(self._pool, os.stat, self.path))
            except OSError:
                continue  # gone for a moment (a replace without rename): the running model keeps answering
            if sig != self._seen:
                await self.reload("watch")
