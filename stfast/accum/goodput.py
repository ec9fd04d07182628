"""Goodput = throughput × statistical efficiency (Pollux: Qiao et al., OSDI 2021, §3.1; AdaptDL),
and the learning-rate rule when the effective batch changes.

Statistical efficiency of a batch of M trips relative to the base batch M0, from the gradient noise
scale φ = B_simple (McCandlish et al. 2018, eq. 2.8: reaching a loss takes E_min·(1 + M/φ) trips):

    E(M) = (φ + M0) / (φ + M)            (1 at M = M0, → M0/M when M ≫ φ)

so one trip at batch M makes E(M) times the progress of one trip at M0, and goodput(k) =
samples_per_s(k) · E(k·B) is training progress per wall-second in base-batch trips.
"""
from __future__ import annotations

import math


def statistical_efficiency(noise_scale: float, batch: float, base_batch: float) -> float:
    """E(M) = (φ + M0)/(φ + M) for φ = ``noise_scale`` (trips), M = ``batch``, M0 = ``base_batch``.
    An unknown noise scale (nan) gives 1.0 (no penalty: the caller has no evidence either way); an
    infinite one (gradient all noise so far) gives 1.0 too. Raises ValueError on batch ≤ 0."""
    if not (batch > 0 and base_batch > 0):
        raise ValueError(f"batch sizes must be > 0, got batch={batch}, base_batch={base_batch}")
    if math.isnan(noise_scale) or math.isinf(noise_scale):
        return 1.0
    phi = max(noise_scale, 0.0)
    return (phi + base_batch) / (phi + batch)


def lr_scale(k: int, rule: str) -> float:
    """Factor on the base learning rate when the effective batch grows k-fold by accumulation.

    sqrt (default, for Adam): lr·√k — Malladi et al., "On the SDEs and Scaling Rules for Adaptive
    Gradient Algorithms" (NeurIPS 2022) derive √ scaling for Adam/RMSprop; Granziol et al., "Learning
    Rates as a Function of Batch Size" (JMLR 2022) find the same for adaptive optimizers.
    linear: lr·k — Goyal et al., "Accurate, Large Minibatch SGD" (2017), for SGD. none: lr.
    Raises ValueError on an unknown rule or k < 1."""
    if k < 1:
        raise ValueError(f"accumulation steps must be ≥ 1, got {k}")
    if rule == "sqrt":
        return math.sqrt(k)
    if rule == "linear":
        return float(k)
    if rule == "none":
        return 1.0
    raise ValueError(f"lr rule must be sqrt, linear or none, got {rule!r}")


class StepTimeModel:
    """Step time t(k) = k·t_micro + t_fixed (seconds): k micro-steps of forward + backward plus what an
    optimizer step costs once whatever k (the gradient all-reduce and waiting for the slowest rank, the
    optimizer step, bookkeeping between steps). Fitted from measured windows by an EMA of both terms, so
    throughput at untried k can be predicted: samples_per_s(k) = k·B / t(k)."""

    def __init__(self, decay: float = 0.5):
        self.decay = decay
        self.t_micro = math.nan
        self.t_fixed = math.nan

    def observe(self, k: int, step_s: float, fixed_s: float) -> None:
        """One measurement: mean optimizer-step time ``step_s`` at ``k`` of which ``fixed_s`` does not grow
        with k (WindowStats.fixed_s per step)."""
        micro = max(step_s - fixed_s, 1e-12) / k
        if math.isnan(self.t_micro):
            self.t_micro, self.t_fixed = micro, fixed_s
        else:
            self.t_micro = self.decay * self.t_micro + (1 - self.decay) * micro
            self.t_fixed = self.decay * self.t_fixed + (1 - self.decay) * fixed_s

    def step_time(self, k: int) -> float:
        return k * self.t_micro + self.t_fixed

    def samples_per_s(self, k: int, micro_batch: int) -> float:
        return k * micro_batch / self.step_time(k)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "t_micro": self.t_micro, "t_fixed": self.t_fixed}

    def load_state_dict(self, s: dict) -> None:
        # "t_sync" in checkpoints before 2026-11-30 (the all-reduce time alone)
        self.decay, self.t_micro, self.t_fixed = s["decay"], s["t_micro"], s.get("t_fixed", s.get("t_sync"))
