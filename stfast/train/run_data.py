"""The data of a training run: its trips (file or synthetic city), the train/validation/test split, the
datasets, driver vocabulary and normalization (from the checkpoint on ``--resume``), the epoch's global
batches, and prediction / evaluation of a model on a split (summed over ranks under data parallelism).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from .._plural import counted
from ..data.batches import LENGTH_SORT_CHUNK, epoch_batches  # noqa: F401  (re-exported: stfast.train.trainer)
from ..data.dataset import DriverVocab, NormStats, TripDataset
from ..data.derived import kept
from ..data.drops import describe as describe_dropped
from ..data.fingerprint import trips_fingerprint
from ..data.load import load_trips, require_trips  # noqa: F401 (require_trips: re-exported)
from ..data.routes import RouteProfile
from ..data.setup import Setup, derive_from_train, split, subtrip_sets
from ..data.subtrips import WithSubtrips
from ..data.trip_view import TripsView
from ..data.trips import Trips
from ..models.deeptte import DeepTTE, DeepTTEConfig
from ..parallel import data_parallel as dp
from . import guards, warm_start
from .config import TrainConfig
from .metrics import baseline_errors, errors
from .resume import resume_checkpoint

log = logging.getLogger("stfast.train")
MIN_SPLIT_WARN = 30  # warn when a split holds fewer trips than this


def load_config_trips(cfg: TrainConfig, preprocess_config=None, model: str | None = None) -> Trips:
    """The trips ``cfg`` names (file or synthetic city), read and preprocessed (with
    ``preprocess_config``, a PreprocessConfig, when given: the one of checkpoint ``model``). Raises ValueError when
    preprocessing dropped every trip (see :func:`require_trips`)."""
    from ..data.readers.columns import mapped

    with mapped(cfg.columns):  # --columns: a CSV of another layout
        trips = load_trips(cfg.data, cfg.format, on_error=cfg.on_error, modes=set(cfg.modes) or None,
                           min_spacing_km=cfg.min_spacing_km, gap_s=cfg.gap_s, tz=cfg.tz,
                           n_synthetic=cfg.n_synthetic, seed=cfg.split_seed, preprocess_config=preprocess_config)
    return require_trips(trips, cfg.data or "the synthetic city", convert_flags=False, model=model)


def load_parent_trips(cfg: TrainConfig, parent: warm_start.Parent | None) -> Trips:
    """The trips ``cfg`` names, preprocessed as the warm start's ``parent`` checkpoint was (its PreprocessConfig,
    time zone included), or as ``cfg`` says without one (:func:`load_config_trips`)."""
    pre = warm_start.preprocess_of(parent)
    if pre is None:
        return load_config_trips(cfg)
    return load_config_trips(replace(cfg, tz=None), pre, str(parent.path))


def run_setup(cfg: TrainConfig) -> Setup:
    """The settings of ``cfg`` that decide what the run derives from its trips (:class:`~stfast.data.setup.Setup`):
    the one mapping from a TrainConfig, so that a default run finds what ``stfast data convert`` derived."""
    draws = cfg.epochs if cfg.subtrips and cfg.subtrips_resample == "epoch" else 1
    return Setup(split_by=cfg.split_by, split=cfg.split, split_days=cfg.split_days, split_seed=cfg.split_seed,
                 kernel_size=guards.model_options(cfg).get("kernel_size", DeepTTEConfig.kernel_size),
                 subtrips=int(cfg.subtrips or 0), subtrips_seed=cfg.seed, subtrip_draws=draws)


def split_trips(trips: Trips, cfg: TrainConfig) -> tuple[TripsView, TripsView, TripsView]:
    """Train/validation/test trips by the configured rule, as views of ``trips`` (an index each, no copy: the
    splits of a memory-mapped store share its pages, :mod:`stfast.data.trip_view`; kept with a store:
    :func:`stfast.data.setup.split`). Raises ValueError on an empty split; warns of a split of few trips."""
    parts = split(trips, run_setup(cfg))
    for name, p in zip(("training", "validation", "test"), parts):
        if len(p) < MIN_SPLIT_WARN:
            log.warning("the %s split has only %s: its metrics are noisy", name, counted(len(p), "trip"))
    return parts  # type: ignore[return-value]


def progress_bar(iterable, enabled: bool, **kw):
    """A tqdm progress bar over ``iterable`` (tqdm's keywords ``kw``), shown when ``enabled`` (rank 0 on a
    terminal); disabled, it iterates, updates and closes silently."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, **kw)


@torch.no_grad()
def predict(model: DeepTTE, ds: TripDataset, batch_size: int = 256, info: dp.DistInfo = dp.DistInfo(),
            device="cpu", progress: bool = False, precision: str = "32") -> np.ndarray:
    """Predicted travel times [T] (s, float64) of every trip of ``ds``, the forward passes in ``precision``
    (stfast.train.precision; the model's parameters and ``ds`` in its parameter dtype); under data parallelism
    each rank predicts its share and the result is summed over ranks (every rank gets all T)."""
    from .precision import autocast, weight_casts

    was = model.training
    model.eval()
    out = np.zeros(len(ds), dtype=np.float64)
    order = np.argsort(ds.lengths, kind="stable")
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    mine = batches[info.rank::info.world_size]
    with weight_casts(precision, device, model.parameters()):  # bf16-mixed: each weight cast once, not per batch
        for idx in progress_bar(mine, progress, desc="evaluate", leave=False, unit="batch"):
            with autocast(precision, device):
                out[idx] = model(ds.batch(idx).to(device)).time.double().cpu().numpy()
    model.train(was)
    return dp.all_reduce_sum(out, info)


def evaluate(model, ds, info=dp.DistInfo(), device="cpu", progress=False, precision: str = "32") -> dict:
    """MAPE (fraction), MAE and RMSE (s) over the whole split (forward passes in ``precision``)."""
    pred = predict(model, ds, info=info, device=device, progress=progress, precision=precision)
    return errors(pred, ds.trips.time)


def preflight(cfg: TrainConfig) -> None:
    """What the ranks would reject, checked once in the launching process (``stfast train --nproc``)
    before any rank starts: the --out folder (one run per folder; cleared here under --overwrite), the
    --resume checkpoint (version, model configuration, data), then more ranks than training trips (this
    reads and splits the data once more). Raises ValueError / FileNotFoundError."""
    cfg.validate()
    guards.check_out_dir(cfg)
    state, path = resume_checkpoint(cfg)
    parent = warm_start.load_parent(cfg) if state is None and cfg.init_from else None
    trips = load_parent_trips(cfg, parent)
    if state is not None:
        guards.check_resume_data(state, trips_fingerprint(trips), len(trips), cfg, path)
    if parent is not None:
        warm_start.check_area(parent, trips, cfg)
    train = split_trips(trips, cfg)[0]
    guards.check_world_size(len(train), cfg.nproc)
    if state is None and kept(train):  # what the ranks derive first, computed here once and kept with the store
        derive_from_train(train, run_setup(cfg))


@dataclass
class RunData:
    """A run's trips and what follows from them. ``train``/``val``/``test``: the splits' Trips, ``*_ds`` their
    TripDatasets (in the run's dtype); ``vocab`` (drivers of the training split), ``stats`` (normalization of
    the training split) and ``model_config``: from the checkpoint when resuming, else computed; ``n_trips``,
    ``fingerprint`` (of all trips, what a resume or ``evaluate --split`` must match), ``dropped`` (counts by
    reason), ``preprocess_config`` and ``tz`` as used."""

    train: Trips
    val: Trips
    test: Trips
    train_ds: TripDataset
    val_ds: TripDataset
    test_ds: TripDataset
    vocab: DriverVocab
    stats: NormStats
    model_config: DeepTTEConfig
    n_trips: int
    fingerprint: str
    dropped: dict
    preprocess_config: object
    tz: str | None
    # --subtrips-resample epoch: train_ds holds the recorded trips, then one set of pieces per epoch; these are
    # the sets' sizes (empty: every epoch trains on all of train_ds)
    piece_sets: tuple[int, ...] = ()
    n_points: int = 0  # points of all trips (kept after preprocessing), to say "dropped P points of N"
    # the training split's RouteProfile as recorded (a warm start's area grown from its parent's; a resumed run's),
    # None: computed from the split (route_profile)
    profile: dict | None = None
    # a warm start (--init-from): what it carried (warm_start.describe), else None
    warm: dict | None = None

    @classmethod
    def load(cls, cfg: TrainConfig, dtype: torch.dtype, world_size: int = 1, resume: dict | None = None,
             resume_path: Path | None = None, parent: warm_start.Parent | None = None) -> RunData:
        """Read, preprocess and split the trips ``cfg`` names. Raises ValueError: no trip left, an empty split,
        more ranks than training trips, a ``resume`` checkpoint (read from ``resume_path``) of other data, or data
        mostly outside the training area of a warm start's ``parent`` (stfast.train.warm_start)."""
        trips = load_parent_trips(cfg, parent)
        fingerprint = trips_fingerprint(trips)
        if resume is not None:
            guards.check_resume_data(resume, fingerprint, len(trips), cfg, resume_path)
        if parent is not None:
            warm_start.check_area(parent, trips, cfg)
        train, val, test = split_trips(trips, cfg)
        guards.check_world_size(len(train), world_size)
        setup = run_setup(cfg)  # what a default run derives here, `stfast data convert` kept (stfast.data.setup)
        profile, warm = None, None
        if resume is not None:
            stats, vocab = NormStats.from_dict(resume["norm_stats"]), DriverVocab.from_list(resume["drivers"])
            mcfg = DeepTTEConfig.from_dict(resume["model_config"])
            profile = resume.get("route_profile")  # a warm start's grown area: the run's own, kept
        elif parent is not None:  # the parent's drivers, statistics and model, its area grown by the split's
            vocab, stats, mcfg, warm = warm_start.training_stats(parent, cfg, train, setup.kernel_size)
            profile, area = warm_start.route_profile(parent, train)
            warm.update(area)
        else:
            vocab = DriverVocab.of_split(train)
            mcfg = DeepTTEConfig(n_drivers=len(vocab), **guards.model_options(cfg))
            stats = NormStats.of_split(train, setup.kernel_size)
        # --subtrips: pieces of the training trips join the training batches only; the statistics, the
        # baselines and the split sizes are the recorded trips'; with --subtrips-resample epoch one fresh set
        # of pieces per epoch (set e is epoch e's; the once set is set 0); pieces as spans of the split's points
        # (kept with a store), batched in place: no copy in any rank
        sets = subtrip_sets(train, setup)
        fit = WithSubtrips(train, sets) if sets else train
        piece_sets = tuple(len(p["m"]) for p in sets) if setup.subtrip_draws > 1 else ()
        train_ds, val_ds, test_ds = (TripDataset(t, vocab, dtype) for t in (fit, val, test))
        return cls(train, val, test, train_ds, val_ds, test_ds, vocab, stats, mcfg, len(trips), fingerprint,
                   dict(trips.dropped), trips.preprocess_config, trips.tz, piece_sets, int(trips.n_points), profile,
                   warm)

    def epoch_batches(self, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
        """The global batches of ``epoch`` (:func:`epoch_batches`) over train_ds: every trip of it, or under
        --subtrips-resample epoch the recorded trips and that epoch's set of pieces (past the sets drawn, set
        ``epoch mod sets``)."""
        lengths = self.train_ds.lengths
        if not self.piece_sets:
            return epoch_batches(lengths, batch_size, seed, epoch)
        e = epoch % len(self.piece_sets)
        start = len(self.train) + sum(self.piece_sets[:e])
        members = np.concatenate([np.arange(len(self.train)), np.arange(start, start + self.piece_sets[e])])
        return epoch_batches(lengths, batch_size, seed, epoch, members)

    def describe(self) -> str:
        """The split sizes, for the log."""
        extra = len(self.train_ds) - len(self.train)
        pieces = (f" (+{self.piece_sets[0]} sub-trips, fresh every epoch)" if self.piece_sets
                  else f" (+{extra} sub-trips)" if extra else "")
        return (f"{counted(self.n_trips, 'trip', spec=',')} → train {len(self.train):,}{pieces}, "
                f"val {len(self.val):,}, test {len(self.test):,}")

    def dropped_text(self) -> str:
        """What reading and preprocessing dropped, points apart from trips (stfast.data.drops.describe)."""
        return describe_dropped(self.dropped, self.n_points or None)

    def summary(self, test: dict, best_val_mape: float, epochs: int, steps: int, world_size: int) -> dict:
        """summary.json of a run: the ``test`` errors (stfast.train.metrics.errors), both baselines', the best
        validation MAPE (None when no epoch was validated), the run's length and the splits' sizes."""
        return {"test_mape": test["mape"], "test_mae": test["mae"], "test_rmse": test["rmse"],
                **baseline_errors(self.train, self.val, self.test),
                "best_val_mape": best_val_mape if math.isfinite(best_val_mape) else None, "epochs": epochs,
                "steps": steps, "n_train": len(self.train), "n_val": len(self.val), "n_test": len(self.test),
                "dropped": self.dropped, "world_size": world_size, "stfast_version": __version__}

    def state_dict(self) -> dict:
        """The data's part of a checkpoint: what RunData.load reads back on --resume (normalization, drivers;
        the model configuration is the model's) and what a resume or ``evaluate --split`` checks (fingerprint,
        trip count, every preprocessing setting as used, None for DeepTTE records that are not preprocessed,
        the time zone) and what :meth:`TrainedModel.eta` needs of the training split (its area, default state,
        spacing: :class:`~stfast.data.routes.RouteProfile`)."""
        return {"norm_stats": self.stats.to_dict(), "drivers": self.vocab.to_list(),
                "data_fingerprint": self.fingerprint, "n_trips": self.n_trips,
                "preprocess_config": None if self.preprocess_config is None else self.preprocess_config.to_dict(),
                "tz": self.tz, "route_profile": self.route_profile}

    @cached_property
    def route_profile(self) -> dict:
        """:class:`~stfast.data.routes.RouteProfile` of the training split (recorded trips), as a dict; a warm
        start's area is its parent's grown by the split's (stfast.train.warm_start.route_profile)."""
        return self.profile if self.profile is not None else RouteProfile.of_split(self.train)
