"""Averages of the weights along one training run: what validation, ``checkpoint.pt`` and the test score use.

Two kinds, both a :class:`torch.optim.swa_utils.AveragedModel` of the trained model, updated after every
optimizer step (the trainer calls ``update_parameters(model)`` there and saves ``state_dict()`` in
``last.pt`` as ``ema_state``):

* ``--swa-start F`` — stochastic weight averaging (Izmailov et al., "Averaging Weights Leads to Wider
  Optima and Better Generalization", UAI 2018): the equal-weight mean of the weights after every optimizer
  step from epoch ⌊F · epochs⌋ on (F in [0, 1); 0.5: the second half of the run). Before that epoch the
  average is empty and :func:`eval_model` is the trained model itself. DeepTTE has no batch norm, so the
  average needs no statistics pass. With a few thousand trips the weights of one run wander from epoch to
  epoch (the validation MAPE of single epochs jumps by points); their mean over the run's last half removes
  most of that, at the cost of one fused ``foreach`` add per step.
* ``--ema-decay D`` — an exponential moving average (Polyak & Juditsky 1992) with decay D per global
  micro-batch (D^k at k accumulation steps, so its horizon is the same stretch of data at every k).

:func:`keeps` is the checkpoint rule: the best validation MAPE so far (the paper's early stopping), or,
with ``--select last``, the latest epoch's weights (under ``--swa-start``: the average of the whole tail),
which chooses nothing on the validation day.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

SELECT = ("best", "last")  # TrainConfig.select
OFF = "none"  # TrainConfig.swa_start: no average (stfast.train.presets.OFF)


class TailAverage(AveragedModel):
    """Equal-weight mean of the weights after each optimizer step taken while ``epoch() >= start``
    (epochs counted from 0); before that, ``update_parameters`` does nothing and ``n_averaged`` stays 0.

    ``model``: the trained module (copied at construction); ``start``: first averaged epoch; ``epoch``:
    returns the current epoch. The mean is kept in the parameters' dtype (float32: its relative
    rounding over a few thousand updates stays near 1e-6)."""

    def __init__(self, model: nn.Module, start: int, epoch: Callable[[], int]):
        super().__init__(model)  # default avg_fn: the running mean p̄ ← p̄ + (p − p̄) / (n + 1)
        self.start, self._epoch = start, epoch

    def update_parameters(self, model: nn.Module) -> None:
        if self._epoch() >= self.start:
            super().update_parameters(model)


def build(cfg, model: nn.Module, k: Callable[[], int], epoch: Callable[[], int]) -> AveragedModel | None:
    """The weight average ``cfg`` asks for (a TrainConfig: ``swa_start``, ``ema_decay``), or None.
    ``k()``: the current accumulation steps per optimizer step; ``epoch()``: the current epoch (from 0)."""
    if cfg.swa_start not in (None, OFF):
        return TailAverage(model, swa_start_epoch(cfg.swa_start, cfg.epochs), epoch)
    if cfg.ema_decay is not None:
        decay = cfg.ema_decay
        return AveragedModel(model, multi_avg_fn=lambda avg, new, n: torch._foreach_lerp_(avg, new, 1.0 - decay ** k()))
    return None


def swa_start_epoch(fraction: float, epochs: int) -> int:
    """First averaged epoch (from 0) of ``--swa-start fraction`` over ``epochs``: ⌊fraction · epochs⌋,
    at most the last epoch."""
    return min(int(fraction * epochs), epochs - 1)


def eval_model(model: nn.Module, average: AveragedModel | None) -> nn.Module:
    """The weights to validate, keep and test: the average once it holds any step, else ``model``."""
    if average is None or int(average.n_averaged) == 0:
        return model
    return average.module


def keeps(select: str, val_mape: float, best: float) -> bool:
    """Whether this epoch's weights become ``checkpoint.pt``: under ``best`` when ``val_mape`` is below the
    best so far, under ``last`` always."""
    return select == "last" or val_mape < best


def check(cfg) -> None:
    """The rules between the averaging options of TrainConfig ``cfg`` (each option's own range is its
    declaration's). Raises ValueError naming the flags."""
    if cfg.swa_start not in (None, OFF) and cfg.ema_decay is not None:
        raise ValueError("--swa-start and --ema-decay are two averages of the weights: choose one "
                         "(--swa-start none turns the preset's average off)")
    if cfg.patience is not None and cfg.select == "last":
        raise ValueError("--patience stops at the best validation epoch, --select last keeps the last one: give "
                         "--select best with --patience (the real-data preset selects last)")
