"""A trained model as a user gets it back from a checkpoint: ``stfast.load_model(path)``.

A checkpoint holds, beside the weights, everything that turns raw data into what the model saw in
training: the reading and preprocessing settings (gap, spacing, transport modes, time zone), the
normalization statistics, the driver vocabulary, the split rule and a fingerprint of the trips. A
:class:`TrainedModel` reads new data exactly so (:meth:`TrainedModel.load_trips`), so evaluation and
prediction see the trips training saw; a setting given explicitly that differs from the checkpoint's
is refused, naming both values.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .._plural import counted
from ..data.coverage import TrainingArea, check_inside, trips_outside
from ..data.dataset import DriverVocab, NormStats, TripDataset
from ..data.drops import describe as describe_dropped
from ..data.fingerprint import trips_fingerprint
from ..data.routes import MAX_ROUTE_POINTS, RouteProfile, routes_to_trips
from ..data.trips import Trips
from ..models import members
from ..models.deeptte import DeepTTE, DeepTTEConfig
from . import checkpoint as ckpt
from .config import TrainConfig, flag, show

log = logging.getLogger("stfast.data")  # what reading the data dropped, as training says it

SPLITS = ("all", "train", "val", "test")
_REQUIRED = ("model_config", "norm_stats", "drivers", "model_state")


@dataclass
class TrainedModel:
    """A DeepTTE model loaded from a checkpoint, in eval mode, with what it needs to predict.

    Attributes:
        model: the network, one DeepTTE or several members trained together (stfast.models.members), its
            parameters in the dtype of :attr:`precision` (float32, or float64 for 64).
        norm_stats: normalization of inputs and outputs (computed on the training split).
        drivers: driver id → embedding row (unseen drivers share row 0).
        config: the training run's configuration: data settings (:meth:`TrainConfig.data_options`),
            split rule, seeds, model options.
        data_fingerprint: :func:`stfast.data.fingerprint.trips_fingerprint` of all trips the run read
            (before splitting); None in checkpoints that do not record it.
        path: the checkpoint file.
        preprocess: every preprocessing setting as the run used it
            (:meth:`stfast.data.preprocess.PreprocessConfig.to_dict`; None when it read DeepTTE records,
            which are not preprocessed).
        tz: the time zone of the run's calendar ids, resolved (an IANA name, or the CSV's own offsets).
        route_profile: what :meth:`eta` needs of the training split (area, default state, spacing) as
            :meth:`stfast.data.routes.RouteProfile.to_dict` wrote it; None in checkpoints that predate it
            (:meth:`route_defaults` then computes it from the run's training data, once).
        precision: what :meth:`predict` and :meth:`eta` compute in (stfast.train.precision: 32, 64 or
            bf16-mixed): the training run's unless :func:`load_model` was told another.
        parent: the checkpoint's ``parent`` entry (the model a warm start began from), None when it records none.
    """

    model: DeepTTE  # or DeepTTEMembers (several members, stfast.models.members)
    norm_stats: NormStats
    drivers: DriverVocab
    config: TrainConfig
    data_fingerprint: str | None
    path: Path
    preprocess: dict | None = None
    tz: str | None = None
    route_profile: dict | None = None
    precision: str = "32"
    parent: object = None

    def __repr__(self) -> str:
        """One line: the model (its class, parameter count and members), what it was trained on (the data, its
        format, the drivers it knows, epochs and seed), the precision it predicts in and the checkpoint
        file; the network's modules are ``print(m.model)``, the full configuration ``m.config``."""
        cfg = self.config
        data = f"{cfg.data} ({cfg.format})" if cfg.data else f"a synthetic city of {cfg.n_synthetic:,} trips"
        epochs = f"{counted(cfg.epochs, 'epoch')}, " if cfg.epochs else ""
        return (f"TrainedModel({type(self.model).__name__}, {members.describe(self.model)}; trained on {data}, "
                f"{counted(len(self.drivers), 'driver', spec=',')}, {epochs}seed {cfg.seed}; "
                f"precision {self.precision} on {self.device}; {self.path})")

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def data_format(self) -> str:
        """The format of the run's training data: ``"synthetic"``, the ``--format`` given, or for ``auto`` the one
        detected from the data's content (stfast.data.readers.detect_format) where the data is still there, else
        ``"auto-detected"``."""
        cfg = self.config
        if not cfg.data:
            return "synthetic"
        if cfg.format != "auto":
            return cfg.format
        from ..data.readers import detect_format

        try:
            return detect_format(cfg.data)
        except (OSError, ValueError):  # moved, or no longer readable here: the run knew, this machine cannot tell
            return "auto-detected"

    def data_options(self) -> dict:
        """The checkpoint's data settings (TrainConfig field names: modes, min_spacing_km, gap_s, tz; tz
        resolved: the zone the run used)."""
        return dict(self.config.data_options(), tz=self.tz or self.config.tz)

    def resolve_data_options(self, **given) -> dict:
        """The checkpoint's data settings, checked against ``given`` (TrainConfig field names; a None
        value means not given). Raises ValueError naming the flag and both values when a given value
        differs from the checkpoint's: the model was trained on trips preprocessed the checkpoint's way."""
        saved = self.data_options()
        for k, v in given.items():
            if v is None:
                continue
            v = sorted(v) if k == "modes" else v
            if v != saved[k]:
                f, was = flag(k), show(k, saved[k])
                raise ValueError(f"{f} {show(k, v)} differs from {self.path}'s {was}: the model was "
                                 f"trained on trips preprocessed with {f} {was}; omit {f} to use it")
        return saved

    def load_trips(self, data: str | os.PathLike | None = None, fmt: str | None = None, on_error: str | None = None,
                   **given) -> Trips:
        """Read ``data`` (a file or folder in format ``fmt``, ``auto`` by default; None: the data the run
        was trained on, in its format — the synthetic city included) and preprocess it exactly as the
        training run did. ``on_error`` (raise or skip; None: the run's own setting on its own data, raise on
        other data). ``given``: data settings the caller set explicitly (see
        :meth:`resolve_data_options`). Raises ValueError (a differing setting; preprocessing dropped
        every trip), TrajectoryFormatError (bad input: file, line, field), FileNotFoundError."""
        from ..data.preprocess import PreprocessConfig
        from .run_data import load_config_trips

        self.resolve_data_options(**given)
        if data is None:
            cfg = replace(self.config, on_error=on_error or self.config.on_error, format=fmt or self.config.format)
        else:
            cfg = replace(self.config, data=str(data), format=fmt or "auto", on_error=on_error or "raise")
        pre = None if self.preprocess is None else PreprocessConfig.from_dict(self.preprocess)
        trips = load_config_trips(replace(cfg, tz=None) if pre is not None else cfg, pre, str(self.path))
        if any(trips.dropped.values()):  # said once (preprocessing logs only its totals)
            log.info("%s", describe_dropped(trips.dropped, trips.n_points))
        return trips

    def split(self, trips: Trips, which: str) -> Trips:
        """The training run's ``which`` split (``train``, ``val``, ``test``; ``all``: ``trips`` as they are)
        of ``trips``, which must be the data the run read (same fingerprint). Raises ValueError otherwise."""
        from .run_data import split_trips

        if which not in SPLITS:
            raise ValueError(f"--split must be one of {', '.join(SPLITS)}, got {which!r}")
        if which == "all":
            return trips
        got = trips_fingerprint(trips)
        if self.data_fingerprint is not None and got != self.data_fingerprint:
            raise ValueError(f"--split {which}: these {len(trips)} trips (fingerprint {got[:12]}) are not the data "
                             f"{self.path} was trained on (fingerprint {self.data_fingerprint[:12]}), so its "
                             "splits do not apply; use --split all")
        return dict(zip(("train", "val", "test"), split_trips(trips, self.config)))[which]

    def predict(self, trips: Trips, batch_size: int = 256, progress: bool = False,
                allow_outside: bool = False) -> np.ndarray:
        """Predicted travel times [T] (s, float64) of ``trips`` (preprocessed as :meth:`load_trips` does).

        Trips with a point outside the training area (:meth:`outside`) are predicted too, unless most of them lie
        outside: then the model never saw that part of the world and its numbers would have no support, and
        OutsideTrainingArea (a ValueError naming how many, the model's area and the data's) is raised, unless
        ``allow_outside``. Checkpoints that record no training area are not checked."""
        from .run_data import predict

        if not allow_outside:
            check_inside(self.training_area(), self.outside(trips), trips, str(self.path), "allow_outside=True")
        ds = TripDataset(trips, self.drivers, self.dtype)
        return predict(self.model, ds, batch_size=batch_size, device=self.device, progress=progress,
                       precision=self.precision)

    def training_area(self) -> TrainingArea | None:
        """Where the model saw trips (:class:`~stfast.data.coverage.TrainingArea` of its training split, as the
        checkpoint records it); None for checkpoints that predate it."""
        return None if self.route_profile is None else self.route_defaults().area

    def unseen_drivers(self, trips: Trips) -> np.ndarray:
        """[T] bool: the trips whose driver the training split did not hold, when the model reads a driver id (they
        get the embedding row reserved for unseen drivers, which training never updates); all False for a model
        without a driver input (``--driver-dim 0``)."""
        if not getattr(self.model.cfg, "driver_dim", 0):
            return np.zeros(len(trips), dtype=bool)
        return self.drivers.encode(trips.driver) == DriverVocab.UNKNOWN

    def outside(self, trips: Trips) -> np.ndarray:
        """[T] bool: the trips of ``trips`` with a point outside :meth:`training_area`
        (:func:`stfast.data.coverage.trips_outside`; all False when the checkpoint records no area)."""
        return trips_outside(self.training_area(), trips)

    def route_defaults(self) -> RouteProfile:
        """The training split's :class:`~stfast.data.routes.RouteProfile` (training area, default state,
        point spacing): the checkpoint's, else (checkpoints that predate it) computed from the run's training
        data, which must then still be readable. Raises what :meth:`load_trips` raises."""
        if self.route_profile is None:
            self.route_profile = RouteProfile.of_split(self.split(self.load_trips(), "train"))
        if not hasattr(self, "_profile"):
            self._profile = RouteProfile.from_dict(self.route_profile)
        return self._profile

    def densify_spacing_km(self) -> float:
        """The spacing (km) :meth:`eta` densifies routes to: the run's ``--min-spacing-km``; for runs that did not
        resample (DeepTTE records, ``--min-spacing-km 0``), the training points' median spacing."""
        pre = self.preprocess or {}
        return float(pre.get("min_spacing_km") or self.route_defaults().spacing_km)

    def route_trips(self, routes, departures, drivers=None, states=None, densify: bool = True,
               max_points: int = MAX_ROUTE_POINTS) -> Trips:
        """The planned routes as the trips :meth:`eta` predicts (arguments as there): checked, densified,
        their distances and calendar ids derived (:func:`stfast.data.routes.routes_to_trips`). Raises RouteError."""
        prof = self.route_defaults()
        tz = self.tz or self.config.tz
        if tz is None:
            raise ValueError(f"{self.path} records no time zone; it cannot place a departure in local time")
        return routes_to_trips(routes, departures, drivers, states, tz=tz, profile=prof,
                               kernel_size=self.norm_stats.kernel_size, max_points=max_points,
                               spacing_km=self.densify_spacing_km() if densify else None)

    def eta(self, routes, departures, drivers=None, states=None, densify: bool = True) -> np.ndarray:
        """Travel times [T] (s, float64) of T planned routes: "when will you arrive?" for a route not yet driven.

        Args:
            routes: [T] routes, each [n_i, 2] (lng, lat) WGS-84 degrees (numpy arrays or nested lists), n_i ≥ 2,
                at most :data:`~stfast.data.routes.MAX_ROUTE_POINTS` (10,000) as given and after densification.
            departures: [T] departure times: datetimes, ISO-8601 text (``2016-11-01T08:30:00+08:00``) or Unix
                seconds. A naive time is read in the checkpoint's time zone (:attr:`tz`; for point-CSV runs, which
                took each timestamp's own offset, a naive time is UTC as the CSV reader reads it); an offset is
                honoured: the instant is converted to the run's local time. The weekday and minute of day are
                derived as preprocessing derives them (:func:`stfast.data.tz.calendar_ids`).
            drivers: [T] driver ids (str or int) or None. A driver the training split did not hold, a None entry or
                no list: the embedding row DeepTTE reserves for unseen drivers (row 0), the row :meth:`predict`
                gives every unseen driver of a test split. Training never updates that row (every training trip's
                driver is known), so it holds its initial value; runs without a driver input (``--driver-dim 0``,
                the real-data preset) are unaffected.
            states: [T] per-point 0/1 arrays (one per point as given) or None: absent, every point gets the state
                most training points had (:attr:`RouteProfile.state`, stored in the checkpoint).
            densify: on (default), each route is interpolated along its segments and resampled by the training
                run's rule to its ``--min-spacing-km`` (:mod:`stfast.data.routes`; runs that did not resample: the
                training points' median spacing), so 3 waypoints and the dense GPS trace of the same path give
                close answers. Off, the points are used as given (a recorded trip's points give :meth:`predict`'s
                number to 1e-6).

        Cumulative distance is haversine (R = 6371 km) along the points, as in preprocessing.

        Returns:
            [T] float64 seconds, in the order given.

        Raises:
            RouteError (a ValueError, naming the route's 0-based index and the field: ``route``, ``departure``,
                ``states``): a route not a list of [lng, lat] pairs, non-finite or out of range (lng ±180, lat ±90),
                more than 10,000 points, fewer points than the geo-conv's kernel (3) after densification, a point
                outside the training area (:class:`~stfast.data.coverage.TrainingArea`: no training point within
                about 1 km), states that are not one 0/1 per point, a departure that does not parse.
            TypeError: departures/drivers/states not one per route.
        """
        trips = self.route_trips(routes, departures, drivers, states, densify)
        # every point of every route is inside the training area already (route_trips refuses one outside)
        return self.predict(trips, allow_outside=True) if len(trips) else np.zeros(0)


def load_model(path: str | os.PathLike, device: str = "cpu", precision: str | None = None) -> TrainedModel:
    """The trained model in checkpoint ``path`` (``checkpoint.pt``: the best validation epoch, or
    ``last.pt``), on ``device``, in eval mode, predicting in ``precision`` (``32``, ``64`` or ``bf16-mixed``;
    None: the precision the checkpoint records, its run's ``--precision``; checkpoints from before it: their
    weights' dtype). The weights are cast to the precision's parameter dtype (a float32 run evaluated in 64
    gets float64 weights).

    Example::

        m = stfast.load_model("runs/chengdu/checkpoint.pt")
        trips = m.load_trips("trips.jsonl")       # preprocessed as in training
        seconds = m.predict(trips)                # [T] float64 travel times

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a stfast checkpoint, or truncated/corrupt (see :func:`stfast.train.checkpoint.load`);
            ``precision`` not one of 32, 64, bf16-mixed.
    """
    from . import gemm_plan
    from . import precision as prec
    from .config import check_device

    check_device(device)
    if precision is not None and precision not in prec.PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(prec.PRECISIONS)}, got {precision!r}")
    path = Path(path)
    state = ckpt.load(path, device)
    missing = [k for k in _REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path} is not a stfast checkpoint (it has no {', '.join(missing)}); use the "
                         "checkpoint.pt or last.pt of a `stfast train` run")
    stats = NormStats.from_dict(state["norm_stats"])
    model = members.build(DeepTTEConfig.from_dict(state["model_config"]), stats)
    if precision is None:  # as trained: the recorded precision; before --precision, the weights' own dtype
        trained = state.get("train_config", {})
        weights = next(v.dtype for k, v in state["model_state"].items() if k.endswith("entire.out.weight"))
        precision = trained.get("precision") or prec.FROM_DTYPE.get(str(weights).removeprefix("torch."), "32")
    model.to(device, prec.param_dtype(precision)).load_state_dict(state["model_state"])
    gemm_plan.apply(state.get("gemm_plan"))  # the run's GEMM libraries: its numbers, not a new probe's
    return TrainedModel(model.eval(), stats, DriverVocab.from_list(state["drivers"]), TrainConfig.from_dict(state.get("train_config", {})),
                        state.get("data_fingerprint"), path, state.get("preprocess_config"), state.get("tz"),
                        state.get("route_profile"), precision, state.get("parent"))
