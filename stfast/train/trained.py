"""A trained model as a user gets it back from a checkpoint: ``stfast.load_model(path)``.

A checkpoint holds, beside the weights, everything that turns raw data into what the model saw in
training: the reading and preprocessing settings (gap, spacing, transport modes, time zone), the
normalization statistics, the driver vocabulary, the split rule and a fingerprint of the trips. A
:class:`TrainedModel` reads new data exactly so (:meth:`TrainedModel.load_trips`), so evaluation and
prediction see the trips training saw; a setting given explicitly that differs from the checkpoint's
is refused, naming both values.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..data.dataset import DriverVocab, NormStats, TripDataset
from ..data.fingerprint import trips_fingerprint
from ..data.trips import Trips
from ..models import members
from ..models.deeptte import DeepTTE, DeepTTEConfig
from . import checkpoint as ckpt
from .config import TrainConfig, flag, show

SPLITS = ("all", "train", "val", "test")
_REQUIRED = ("model_config", "norm_stats", "drivers", "model_state")


@dataclass
class TrainedModel:
    """A DeepTTE model loaded from a checkpoint, in eval mode, with what it needs to predict.

    Attributes:
        model: the network, one DeepTTE or several members trained together (stfast.models.members), its
            parameters in the dtype it was trained in (float32 or float64).
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
    """

    model: DeepTTE  # or DeepTTEMembers (several members, stfast.models.members)
    norm_stats: NormStats
    drivers: DriverVocab
    config: TrainConfig
    data_fingerprint: str | None
    path: Path
    preprocess: dict | None = None
    tz: str | None = None

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype

    @property
    def device(self):
        return next(self.model.parameters()).device

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
        return load_config_trips(replace(cfg, tz=None) if pre is not None else cfg, pre)

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

    def predict(self, trips: Trips, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Predicted travel times [T] (s, float64) of ``trips`` (preprocessed as :meth:`load_trips` does)."""
        from .run_data import predict

        ds = TripDataset(trips, self.drivers, self.dtype)
        return predict(self.model, ds, batch_size=batch_size, device=self.device, progress=progress)


def load_model(path: str | os.PathLike, device: str = "cpu") -> TrainedModel:
    """The trained model in checkpoint ``path`` (``checkpoint.pt``: the best validation epoch, or
    ``last.pt``), on ``device``, in eval mode.

    Example::

        m = stfast.load_model("runs/chengdu/checkpoint.pt")
        trips = m.load_trips("trips.jsonl")       # preprocessed as in training
        seconds = m.predict(trips)                # [T] float64 travel times

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not a stfast checkpoint, or truncated/corrupt (see :func:`stfast.train.checkpoint.load`).
    """
    from .config import check_device

    check_device(device)
    path = Path(path)
    state = ckpt.load(path, device)
    missing = [k for k in _REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path} is not a stfast checkpoint (it has no {', '.join(missing)}); use the "
                         "checkpoint.pt or last.pt of a `stfast train` run")
    stats = NormStats.from_dict(state["norm_stats"])
    model = members.build(DeepTTEConfig.from_dict(state["model_config"]), stats)
    dtype = next(v.dtype for k, v in state["model_state"].items() if k.endswith("entire.out.weight"))  # as trained
    model.to(device, dtype).load_state_dict(state["model_state"])
    return TrainedModel(model.eval(), stats, DriverVocab.from_list(state["drivers"]), TrainConfig.from_dict(state.get("train_config", {})),
                        state.get("data_fingerprint"), path, state.get("preprocess_config"), state.get("tz"))
