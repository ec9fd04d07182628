"""Default training options by data: the paper's DeepTTE, or the set chosen for small real data sets.

``stfast train --preset auto|real|paper`` (``TrainConfig(preset=...)``, default auto) fills every option
of :data:`FIELDS` that was not given (None), when the TrainConfig is built: the command line and the
Python API resolve the same way, and the config records the resolved name (``preset``: paper or real).

* ``paper`` — the faithful reproduction of DeepTTE (Wang et al., AAAI 2018) with the original's faults
  fixed: normalized-time head, MAPE loss, driver embedding 16, departure time per minute, one row per
  weekday, no dropout, no weight averaging, checkpoint at the best validation MAPE, 10 epochs (the
  defaults before presets, exactly).
* ``real`` — chosen on the Chengdu date split (``docs/real_data.md``; the width and the epochs by
  leave-one-day-out cross-validation over the six training and validation days, benchmarks/day_cv.py): the
  prior head (the untrained model is the constant-speed baseline; training learns a log-correction), the log
  loss, no driver id (most validation and test drivers are unseen), departure time per half hour, a
  weekday/weekend embedding (the days of a small sample miss most weekdays), dropout 0.3, one model of width
  64 instead of 128 (half the time per epoch at the same validation error), one random sub-trajectory of
  every training trip added to the training batches (``--subtrips 1``: the one change of the recipe that was
  better on five of the six days), and stochastic weight averaging over the last half of 20 epochs, kept at
  the last epoch (no per-epoch choice on the validation day).
* ``auto`` — ``paper`` on the synthetic city (where it reaches about 4 % MAPE), ``real`` on files.

An explicit ``--ema-decay`` replaces the preset's weight average (``swa_start`` not given becomes
``"none"``); ``--swa-start none`` turns it off. ``--parallel cp`` / ``dp+cp`` places one model's components,
so ``members`` not given is 1 there.
"""
from __future__ import annotations

from .swa import OFF  # swa_start: no weight average
PRESETS = {
    "paper": {"epochs": 10, "lr": 1e-3, "weight_decay": 0.0, "head": "paper", "loss": "mape", "dropout": 0.0,
              "driver_dim": 16, "time_bin_min": 1, "week": "day", "swa_start": OFF, "select": "best",
              "hidden_size": 128, "members": 1, "subtrips": 0, "subtrips_resample": "once"},
    "real": {"epochs": 20, "lr": 1e-3, "weight_decay": 0.0, "head": "prior", "loss": "log", "dropout": 0.3,
             "driver_dim": 0, "time_bin_min": 30, "week": "weekend", "swa_start": 0.5, "select": "last",
             "hidden_size": 64, "members": 1, "subtrips": 1, "subtrips_resample": "once"},
}
FIELDS = tuple(PRESETS["paper"])  # the TrainConfig fields a preset fills
CHOICES = ("auto", "real", "paper")


def resolve(preset: str, data: str | None, fmt: str = "auto") -> str:
    """The preset ``auto`` stands for: ``paper`` for the synthetic city (no ``data``, or format
    synthetic), ``real`` for a file or folder of trips; another name is returned as it is."""
    if preset != "auto":
        return preset
    return "paper" if data is None or fmt == "synthetic" else "real"


def fill(cfg) -> None:
    """Resolve ``cfg.preset`` (a TrainConfig's) and set each field of :data:`FIELDS` that is None to that
    preset's value, in place. Idempotent: a filled config (a checkpoint's, a ``dataclasses.replace`` of
    one) stays as it is."""
    cfg.preset = resolve(cfg.preset, cfg.data, cfg.format)
    values = PRESETS[cfg.preset]
    for k in FIELDS:
        if getattr(cfg, k) is None:
            setattr(cfg, k, _value(cfg, k, values[k]))


def _value(cfg, k: str, preset_value):
    """The value preset field ``k`` not given takes: the preset's, except where another flag given rules it
    out (an explicit --ema-decay replaces the weight average; component parallelism places one model)."""
    if k == "swa_start" and cfg.ema_decay is not None:
        return OFF
    if k == "members" and cfg.parallel != "dp":
        return 1
    return preset_value


def help_suffix(name: str, show=str) -> str:
    """What `stfast train --help` adds to the help of preset field ``name``: its value under each preset
    (``show``: a value as written in the flag)."""
    return f" [preset] (default: paper {show(PRESETS['paper'][name])}, real {show(PRESETS['real'][name])})"
