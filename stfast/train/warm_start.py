"""Warm start: a new run that starts from another run's checkpoint on new data (issue 63).

``stfast train --init-from CHECKPOINT --data NEW`` (``TrainConfig(init_from=...)``) trains a fresh run in
``--out`` whose model starts as the checkpoint's:

* carried over: the weights; the model options (width, driver embedding, heads: the checkpoint's where not
  given), the preset and the precision (where not given); the preprocessing (time zone, resampling, gap,
  transport modes, trip filters: the checkpoint's ``preprocess_config``, as ``stfast evaluate`` reads new data)
  and the normalization statistics, so the old and the new model's predictions stay comparable
  (``--refit-stats``: the statistics are computed on the new training split instead);
* drivers: the checkpoint's vocabulary is kept, row for row (a known driver's embedding row is the checkpoint's,
  bitwise, matched by driver id); drivers of the new training split it never saw are appended, their rows
  initialized as a fresh model of that size would be (the run's ``--seed``);
* the training area (stfast.data.coverage) is the union of the checkpoint's and the new training split's, and
  the run says by how much it grew (``training area: 412 cells, 37 new``).

Refused in one line (ValueError naming the difference): another model shape or preset (an option given that
differs from the checkpoint's), another preprocessing setting given, data whose trips lie mostly outside the
checkpoint's training area (the rule of ``stfast evaluate``; ``--allow-outside`` trains on them anyway), a
float64 checkpoint into a float32 run (its weights would be rounded). A float32 checkpoint into ``--precision
64`` is exact (widening), and ``32`` and ``bf16-mixed`` share float32 weights: both are allowed. ``--resume``
with ``--init-from`` is refused (one continues a run, the other starts one).

Lineage: the run's checkpoints and summary.json record ``parent``: the checkpoint's path, the first 16 hex
digits of the SHA-256 of its file, and its own ``parent`` (so the chain reads back), and ``stfast report``
shows it. The optimizer, learning-rate schedule, accumulation and epochs start afresh.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import checkpoint as ckpt

#: the model options that make another model (shape, or what the outputs mean): a given value that differs from the
#: checkpoint's is refused. The others (alpha, loss, dropout, kernels) are how it trains: a fine-tune may change them
SHAPE = ("hidden_size", "driver_dim", "members", "time_bin_min", "week", "head", "compat")
_REQUIRED = ("model_config", "model_state", "drivers", "norm_stats")


@dataclass
class Parent:
    """The checkpoint a run starts from: its ``state`` (loaded, checked), ``path`` and ``sha256`` (the first 16 hex
    digits of the SHA-256 of its file)."""

    state: dict
    path: Path
    sha256: str

    def lineage(self) -> dict:
        """What the child records as its ``parent``: path (absolute), sha256 and the checkpoint's own parent."""
        return {"path": str(self.path.resolve()), "sha256": self.sha256, "parent": self.state.get("parent")}


def file_sha256(path) -> str:
    """The first 16 hex digits of the SHA-256 of the file at ``path`` (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def check_flags(cfg) -> None:
    """The rules between the warm-start flags of TrainConfig ``cfg`` (called by its validate). Raises ValueError."""
    if not cfg.init_from:
        for name, given in (("--refit-stats", cfg.refit_stats), ("--allow-outside", cfg.allow_outside)):
            if given:
                raise ValueError(f"{name} applies to a warm start: give it with --init-from CHECKPOINT")
        return
    if cfg.resume:
        raise ValueError("--init-from starts a new run from another run's checkpoint, --resume continues the run in "
                         "--out: choose one")
    src, out = Path(cfg.init_from).resolve(), Path(cfg.out).resolve()
    if out in src.parents:
        raise ValueError(f"--init-from {cfg.init_from} is inside --out {cfg.out}, the folder this run writes: copy it "
                         "elsewhere first, or train into another --out")


# TrainConfig's names below come from the config given (type(cfg)): stfast.train.config imports this module
def _default(cfg, name: str):
    return type(cfg).__dataclass_fields__[name].default


def _flag(cfg, name: str) -> str:
    from .. import _options

    return _options.flag(type(cfg), name)


def _show(cfg, name: str, value) -> str:
    from .. import _options

    return _options.show(type(cfg), name, value)


def _model_options(cfg) -> dict:
    """The DeepTTEConfig options TrainConfig ``cfg`` sets (stfast.train.config.MODEL_OPTIONS), by field name."""
    from .. import _options
    from ..models.deeptte import DeepTTEConfig

    return {k: getattr(cfg, k) for k in _options.names_from(type(cfg), DeepTTEConfig)}


def _norm(name: str, v):
    return sorted(v or ()) if name == "modes" else v


def fill(cfg) -> tuple[dict, Path] | None:
    """``TrainConfig(init_from=...)``: each option not given takes the checkpoint's value, in place: the preset
    (``auto``), the model options (None), the precision (neither ``precision`` nor ``dtype``) and the preprocessing
    settings left at their defaults. Returns (state, path) for :func:`check`, or None when the checkpoint does not
    load (the Trainer's :func:`load_parent` raises then, naming it). Raises ValueError for another ``--preset``."""
    try:
        state = ckpt.load(cfg.init_from)
    except (OSError, ValueError):
        return None
    path = Path(cfg.init_from)
    saved = state.get("train_config", {})
    was = saved.get("preset", "paper")
    if cfg.preset not in ("auto", was):
        raise ValueError(f"--init-from {path} was trained with --preset {was}, not {cfg.preset}: omit --preset to "
                         "fine-tune it, or train from scratch without --init-from")
    cfg.preset = was
    model = state.get("model_config", {})
    for k in _model_options(cfg):
        if getattr(cfg, k) is None and model.get(k) is not None:
            setattr(cfg, k, model[k])
    keep_preprocessing(cfg, saved)
    if cfg.precision is None and cfg.dtype is None:
        from .precision import of_train_config

        cfg.precision = of_train_config(saved)
    return state, path


def keep_preprocessing(cfg, saved: dict) -> None:
    """Each preprocessing setting of TrainConfig ``cfg`` left at its default (not given) takes the value of the
    checkpoint's ``train_config`` ``saved``, in place (a warm start's; a warm-started run resumed)."""
    from ..data.options import PREPROCESS_OPTIONS

    for k in PREPROCESS_OPTIONS:
        if k in saved and _norm(k, getattr(cfg, k)) == _norm(k, _default(cfg, k)):
            setattr(cfg, k, tuple(saved[k] or ()) if k == "modes" else saved[k])


def check(cfg, state: dict, path) -> None:
    """Refuse (ValueError, one line naming the difference) a warm start of TrainConfig ``cfg`` (filled, resolved)
    from checkpoint ``state`` read from ``path``: another preset or model shape (:data:`SHAPE`), a float64
    checkpoint into float32 weights, another preprocessing setting."""
    import dataclasses

    from ..data.options import PREPROCESS_OPTIONS
    from ..models.deeptte import DeepTTEConfig
    from .precision import PARAM_DTYPE, of_train_config

    def flag(k):
        return _flag(cfg, k)

    def show(k, v):
        return _show(cfg, k, v)

    saved = state.get("train_config", {})
    was = saved.get("preset", "paper")
    diff = [] if cfg.preset == was else [f"--preset {was} in the checkpoint, {cfg.preset} now"]
    model = {f.name: f.default for f in dataclasses.fields(DeepTTEConfig)} | state.get("model_config", {})
    diff += [f"{flag(k)} {show(k, model[k])} in the checkpoint, {show(k, getattr(cfg, k))} now" for k in SHAPE
             if model.get(k) != getattr(cfg, k)]
    if diff:
        raise ValueError(f"--init-from {path} is another model: {'; '.join(diff)}; omit them to fine-tune it, or "
                         "train from scratch without --init-from")
    had = of_train_config(saved)
    if PARAM_DTYPE[had] == "float64" and PARAM_DTYPE[cfg.precision] != "float64":
        raise ValueError(f"--init-from {path} holds float64 weights (--precision {had}): --precision {cfg.precision} "
                         "would round them to float32; omit --precision (the checkpoint's) or give --precision 64")
    for k in PREPROCESS_OPTIONS:
        have, now = _norm(k, saved.get(k, _default(cfg, k))), _norm(k, getattr(cfg, k))
        if have != now:
            f = flag(k)
            raise ValueError(f"--init-from {path}: {f} {show(k, now)} differs from the checkpoint's {show(k, have)}: "
                             f"a warm start keeps the model's preprocessing, so that its predictions stay comparable; "
                             f"omit {f}")


def load_parent(cfg) -> Parent:
    """The checkpoint ``cfg.init_from``, loaded and checked (:func:`check`), with its file's fingerprint. Raises
    FileNotFoundError / ValueError naming it (missing, corrupt, not a training run's, refused)."""
    path = Path(cfg.init_from)
    state = ckpt.load(path)
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise ValueError(f"--init-from {path} is not the checkpoint of a stfast train run (it has no "
                         f"{', '.join(missing)})")
    check(cfg, state, path)
    return Parent(state, path, file_sha256(path))


def preprocess_of(parent: Parent | None):
    """The checkpoint's PreprocessConfig (None: none, or DeepTTE records, which are not preprocessed)."""
    pre = None if parent is None else parent.state.get("preprocess_config")
    if pre is None:
        return None
    from ..data.preprocess import PreprocessConfig

    return PreprocessConfig.from_dict(pre)


def check_area(parent: Parent, trips, cfg) -> None:
    """Refuse ``trips`` when most of them lie outside the checkpoint's training area (stfast.data.coverage.check_inside:
    OutsideTrainingArea, one line), unless ``cfg.allow_outside``; checkpoints that record no area are not checked."""
    prof = parent.state.get("route_profile")
    if cfg.allow_outside or prof is None:
        return
    from ..data.coverage import TrainingArea, check_inside, trips_outside

    area = TrainingArea.from_dict(prof["area"])
    check_inside(area, trips_outside(area, trips), trips, f"--init-from {parent.path}", "--allow-outside",
                 anyway="to train on them anyway")


def training_stats(parent: Parent, cfg, train, kernel_size: int):
    """(DriverVocab, NormStats, DeepTTEConfig, facts) of a warm start on training split ``train``: the checkpoint's
    drivers followed by the split's new ones (sorted), the checkpoint's statistics (``cfg.refit_stats``: the split's),
    the checkpoint's model configuration with ``cfg``'s model options and the grown vocabulary's size. ``facts``:
    {drivers_known, drivers_new, refit_stats} of the split's drivers."""
    from ..data.dataset import DriverVocab, NormStats
    from ..models.deeptte import DeepTTEConfig

    st = parent.state
    old = DriverVocab.from_list(list(st["drivers"]))
    seen = DriverVocab.of_split(train).to_list()
    new = sorted(d for d in seen if d not in old.index)
    vocab = DriverVocab.from_list(old.to_list() + new)
    stats = (NormStats.of_split(train, kernel_size) if cfg.refit_stats else NormStats.from_dict(st["norm_stats"]))
    mcfg = DeepTTEConfig.from_dict({**st["model_config"], **_model_options(cfg), "n_drivers": len(vocab)})
    return vocab, stats, mcfg, {"drivers_known": len(seen) - len(new), "drivers_new": len(new),
                                "refit_stats": bool(cfg.refit_stats)}


def route_profile(parent: Parent, train) -> tuple[dict, dict]:
    """The warm run's route profile (stfast.data.routes.RouteProfile as a dict): the new training split's, its area
    the union of the checkpoint's and the split's (:meth:`TrainingArea.extended`); and {cells, cells_new}."""
    from ..data.coverage import TrainingArea
    from ..data.routes import RouteProfile
    from ..data.trip_view import iter_chunks

    prof = RouteProfile.of_split(train)
    old = parent.state.get("route_profile")
    if old is None:  # a checkpoint that predates the area: the split's
        return prof, {"cells": len(prof["area"]["cells"]), "cells_new": None}
    before = TrainingArea.from_dict(old["area"])
    area = before.extended(lambda: ((p.lng, p.lat) for p in iter_chunks(train, point_fields=("lng", "lat"))))
    return dict(prof, area=area.to_dict()), {"cells": len(area.cells), "cells_new": len(area.cells) - len(before.cells)}


def describe(facts: dict) -> str:
    """The run's line on what it carried: drivers, statistics, the training area."""
    from .._plural import counted

    cells = facts["cells_new"]
    area = f"{counted(facts['cells'], 'cell')}, {cells} new" if cells is not None else \
        f"{counted(facts['cells'], 'cell')} (the checkpoint records none)"
    stats = "refit on the new training split" if facts["refit_stats"] else "the checkpoint's"
    return (f"drivers: {facts['drivers_known']} known, {facts['drivers_new']} new; normalization statistics: "
            f"{stats}; training area: {area}")


def _norm_names() -> set:
    from ..data.dataset import NormStats

    return {f for f in NormStats.__dataclass_fields__ if f != "kernel_size"}


def init_model(tr, parent: Parent) -> dict:
    """Trainer ``tr``'s model (built for the grown vocabulary, seeded) takes the checkpoint's weights: its driver
    rows into the first rows, the rows of new drivers as initialized; under ``--refit-stats`` its normalization
    buffers stay the new split's. Says what was carried; returns the lineage to record (:meth:`Parent.lineage`).
    Raises ValueError in one line when the weights do not fit the model."""
    import torch

    own, norm = tr.model.state_dict(), _norm_names()
    refit = tr.cfg.refit_stats
    state = {}
    for k, v in parent.state["model_state"].items():
        if refit and k.rsplit(".", 1)[-1] in norm and k in own:
            state[k] = own[k]
        elif k.endswith("attr.driver.weight") and k in own and own[k].shape[0] > v.shape[0]:
            w = own[k].detach().clone()
            w[:v.shape[0]] = v.to(w.dtype)
            state[k] = w
        else:
            state[k] = v
    try:
        with torch.no_grad():
            tr.model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"--init-from {parent.path}: its weights do not fit this model ({' '.join(str(e).split())})") from None
    tr.say(f"warm start from {parent.path} (sha256 {parent.sha256}): {describe(tr.data.warm)}")
    return parent.lineage()
