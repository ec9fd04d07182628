"""Several DeepTTE models trained together in one run: a seed ensemble at the cost of one run's setup.

``DeepTTEConfig.members`` = K (``stfast train --members K``) builds K DeepTTE models that share the
normalization statistics and nothing else. Each is initialized from its own draws of the seeded generator,
all see the same batches in the same order, and the training loss is the sum of the members' own losses
(:func:`stfast.models.deeptte.loss_parts`), so each member's gradient is exactly its own loss's and one
Adam over all parameters (per element) steps each member as its own optimizer would. A prediction is
the members' mean travel time, as :func:`stfast.train.ensemble.predict_ensemble` averages separately
trained seeds. Averaging the predictions of independently initialized networks reduces the variance of
one model's error (Lakshminarayanan, Pritzel, Blundell, "Simple and Scalable Predictive Uncertainty
Estimation using Deep Ensembles", NeurIPS 2017); on the Chengdu sample the seed-to-seed spread of one model
is as large as the differences between configurations (docs/real_data.md).

Compute: the members run one after another, K times one member's work per step; a narrower member
(``hidden_size``) pays for it (docs/real_data.md measures both).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from ..data.dataset import NormStats, TripBatch
from .deeptte import DeepTTE, DeepTTEConfig, DeepTTEOutput


class DeepTTEMembers(nn.Module):
    """K = ``cfg.members`` ≥ 2 DeepTTE models trained together (module docstring).

    ``forward(b)`` returns a :class:`DeepTTEOutput` whose ``time`` [B] (s) and ``local_time`` [B, L'] (s) are
    the members' means and whose ``members`` holds each member's own output (what the training loss uses).
    Raises ValueError for ``cfg.members`` < 2, and from :meth:`component_graph`: component parallelism
    places one DeepTTE's components.
    """

    def __init__(self, cfg: DeepTTEConfig, stats: NormStats):
        super().__init__()
        if cfg.members < 2:
            raise ValueError(f"DeepTTEMembers needs members >= 2, got {cfg.members} (one model: DeepTTE)")
        self.cfg = cfg
        one = replace(cfg, members=1)
        self.members = nn.ModuleList(DeepTTE(one, stats) for _ in range(cfg.members))

    def forward(self, b: TripBatch) -> DeepTTEOutput:
        outs = tuple(m(b) for m in self.members)
        return DeepTTEOutput(time=torch.stack([o.time for o in outs]).mean(0),
                             local_time=torch.stack([o.local_time for o in outs]).mean(0),
                             mask=outs[0].mask, members=outs)

    def component_graph(self, split_lstm_layers: bool = False):
        raise ValueError(f"--members {self.cfg.members}: component parallelism (--parallel cp, dp+cp) places one "
                         "DeepTTE's components; train several members with --parallel dp")


def describe(model: nn.Module) -> str:
    """The model for the run's start-up line: its parameter count, and its members and width when there are
    several (``176,632 parameters: 2 members of width 64``)."""
    n = f"{sum(p.numel() for p in model.parameters()):,} parameters"
    return n if model.cfg.members == 1 else f"{n}: {model.cfg.members} members of width {model.cfg.hidden_size}"


def build(cfg: DeepTTEConfig, stats: NormStats) -> nn.Module:
    """The model ``cfg`` describes: :class:`DeepTTE` (``members`` = 1) or :class:`DeepTTEMembers`. Raises
    ValueError as they do."""
    return DeepTTE(cfg, stats) if cfg.members == 1 else DeepTTEMembers(cfg, stats)
