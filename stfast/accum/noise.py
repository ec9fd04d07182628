"""Gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", arXiv:1812.06162, Appendix A), estimated without extra backward passes.

Σ is the per-trip gradient covariance and G the true gradient. A mean gradient over b trips has
E|g_b|² = |G|² + tr(Σ)/b, so two batch sizes b_small < b_big give the unbiased estimates (eqs. A.1, A.2)

    |G|²  ≈ (b_big·|g_big|² − b_small·|g_small|²) / (b_big − b_small)
    tr(Σ) ≈ (|g_small|² − |g_big|²) / (1/b_small − 1/b_big)

During data-parallel training with accumulation the small batches are the *units* — one rank's
shard of one micro-batch — and the big batch is the whole optimizer step (all ranks, all k
micro-steps): the units' gradients exist anyway (before the all-reduce, and as differences of the
accumulated gradient between micro-steps), so no backward pass is added. Units of unequal size
(the slicer's shards) are handled exactly: averaging |g_u|² over U units has expectation
|G|² + tr(Σ)·mean(1/b_u), so b_small is the harmonic mean of the unit sizes.

Both estimates are noisy and |G|² can come out negative on one step, so numerator and denominator
are smoothed separately by an EMA and divided only afterwards (the paper's recommendation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def noise_estimates(small_sq: float, b_small: float, big_sq: float, b_big: float) -> tuple[float, float]:
    """Unbiased (|G|², tr(Σ)) from squared norms of mean gradients at two batch sizes (eqs. A.1–A.2).

    small_sq: mean of |g_small|² over the small batches; b_small: their size (trips; for unequal sizes
    the harmonic mean); big_sq: |g_big|²; b_big: its size (trips). Raises ValueError unless
    0 < b_small < b_big."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass
class UnitNorms:
    """Per-step accumulator of the small-batch statistics: Σ_u |g_u|², Σ_u 1/b_u and the unit count U
    (summed over micro-steps on a rank, then over ranks inside the gradient all-reduce)."""

    sq_sum: float = 0.0
    inv_size_sum: float = 0.0
    count: float = 0.0

    def add(self, mean_grad_sq: float, n_trips: int) -> None:
        """One unit: |g_u|² of its MEAN gradient over its ``n_trips`` (> 0) trips."""
        self.sq_sum += mean_grad_sq
        self.inv_size_sum += 1.0 / n_trips
        self.count += 1.0

    def as_array(self) -> np.ndarray:
        return np.array([self.sq_sum, self.inv_size_sum, self.count], dtype=np.float64)


class GradientNoiseScale:
    """EMA-smoothed B_simple (in trips). ``update`` takes one optimizer step's statistics.

    decay: EMA weight of the history (0.9 ≈ the last ten steps); estimates are bias-corrected like
    Adam's moments, so the first update is not shrunk toward zero."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.g2_ema = 0.0
        self.g2_sq_ema = 0.0  # of the per-step |G|² estimates squared: their spread, for g2_stderr
        self.trace_ema = 0.0
        self.n = 0

    def update(self, units: np.ndarray, big_sq: float, b_big: float) -> bool:
        """units: the all-reduced [Σ|g_u|², Σ1/b_u, U] (float64 [3]); big_sq: |g|² of the step's mean
        gradient over its ``b_big`` trips. Returns False (and changes nothing) when the step has fewer
        than two units, where the two batch sizes coincide."""
        sq_sum, inv_sum, count = (float(x) for x in units)
        if count < 2:
            return False
        b_small = count / inv_sum
        if not b_small < b_big:
            return False
        g2, trace = noise_estimates(sq_sum / count, b_small, big_sq, b_big)
        self.g2_ema = self.decay * self.g2_ema + (1 - self.decay) * g2
        self.g2_sq_ema = self.decay * self.g2_sq_ema + (1 - self.decay) * g2 * g2
        self.trace_ema = self.decay * self.trace_ema + (1 - self.decay) * trace
        self.n += 1
        return True

    @property
    def g2(self) -> float:
        """Bias-corrected EMA of |G|² (nan before the first update)."""
        return self.g2_ema / (1 - self.decay ** self.n) if self.n else math.nan

    @property
    def trace(self) -> float:
        """Bias-corrected EMA of tr(Σ) (nan before the first update)."""
        return self.trace_ema / (1 - self.decay ** self.n) if self.n else math.nan

    @property
    def value(self) -> float:
        """B_simple = tr(Σ)/|G|² in trips; nan before the first update and while the |G|² estimate is ≤ 0.

        A non-positive |G|² is the estimator's own noise exceeding the signal (|g_big|² minus tr(Σ)/b_big),
        not evidence of an infinite noise scale: with two units per step it happens on many steps once
        B_simple exceeds the batch (benchmarks/noise_scale_units.py). Reporting inf there told the
        schedulers that large batches cost nothing; nan tells them the estimate is unknown, and they
        keep their last finite one."""
        if not self.n:
            return math.nan
        g2 = self.g2
        return self.trace / g2 if g2 > 0 else math.nan

    @property
    def g2_stderr(self) -> float:
        """Standard error of the bias-corrected |G|² EMA (nan before two updates), from the spread of the
        per-step estimates: with normalized EMA weights w_i, Var = v·Σw_i² and the weighted sample
        variance has expectation v·(1 − Σw_i²), where Σw_i² = (1−d)(1+dⁿ) / ((1+d)(1−dⁿ))."""
        if self.n < 2:
            return math.nan
        d, n = self.decay, self.n
        w2 = (1 - d) * (1 + d ** n) / ((1 + d) * (1 - d ** n))
        spread = max(self.g2_sq_ema / (1 - d ** n) - self.g2 ** 2, 0.0)
        return math.sqrt(spread / (1 - w2) * w2)

    def lower_confidence(self, z: float = 2.0) -> float:
        """A conservative B_simple: tr(Σ) / (|G|² + z·stderr(|G|²)), in trips; nan before two updates or while
        that denominator is ≤ 0. What the trainer's schedulers steer by.

        With two units per step (two ranks, k = 1) the per-step |G|² estimate is noisier than |G|² itself
        once B_simple exceeds the batch, and the point estimate ``value`` then jumps by orders of magnitude
        between windows as the EMA of |G|² passes near zero (5,319 trips after 129 four steps earlier, in
        a live Chengdu run); a scheduler reading that as "large batches are free" spends whole windows at
        k = 16. The bound instead grows as the evidence that |G|² is small accumulates, and errs toward a
        smaller noise scale — smaller k — when |G|² is uncertain. z = 2 is a one-sided ~98 % bound for a
        normal EMA."""
        se = self.g2_stderr
        if math.isnan(se):
            return math.nan
        denom = self.g2 + z * se
        return self.trace / denom if denom > 0 else math.nan

    def state_dict(self) -> dict:
        return {"decay": self.decay, "g2_ema": self.g2_ema, "g2_sq_ema": self.g2_sq_ema,
                "trace_ema": self.trace_ema, "n": self.n}

    def load_state_dict(self, s: dict) -> None:
        self.decay, self.g2_ema, self.trace_ema, self.n = s["decay"], s["g2_ema"], s["trace_ema"], s["n"]
        # absent in checkpoints before 2026-11-30: then the spread starts from that of the mean alone
        self.g2_sq_ema = s.get("g2_sq_ema", s["g2_ema"] ** 2)


def squared_norm(tensors) -> float:
    """Σ‖t‖² over ``tensors`` (None entries skipped; 0.0 for none), accumulated in float64 with one
    fused norm per tensor group (``torch._foreach_norm``, as ``torch.nn.utils.clip_grad_norm_`` uses): it
    is inf or nan exactly when an element is (float32 or float16 gradients cannot overflow it)."""
    import torch

    ts = [t for t in tensors if t is not None]
    if not ts:
        return 0.0
    return float(torch.stack(torch._foreach_norm(ts, 2, dtype=torch.float64)).square().sum())


class UnitGradients:
    """Squared norms of each unit's mean gradient, read off the accumulating ``.grad`` of ``params``
    between micro-steps (a copy of the gradient tensors after each micro-step but the last; no extra
    backward pass).

    Use: ``begin()`` before the first micro-step, ``after_micro_step(n)`` after each backward of a
    unit of n trips whose loss was its trip SUM divided by ``n_total`` (the optimizer step's trips),
    then ``units`` holds the step's UnitNorms."""

    def __init__(self, params):
        self.params = list(params)
        self.units = UnitNorms()
        self._prev = None  # the .grad tensors (copies; None: no gradient yet) after the previous micro-step

    def begin(self) -> None:
        self.units = UnitNorms()
        self._prev = None

    def after_micro_step(self, n_trips: int, n_total: int, last: bool = False) -> None:
        """Record the unit just backpropagated: its mean gradient is the change of .grad × n_total/n_trips.
        ``last``: no micro-step follows in this optimizer step, so .grad is not copied for the next one."""
        if n_trips <= 0:
            return
        grads = [p.grad for p in self.params]
        if self._prev is None:
            sq = squared_norm(grads)
        else:  # per tensor, so no flat copy; a tensor whose first gradient came in this unit changed by all of it
            sq = squared_norm([g if pv is None else g - pv for g, pv in zip(grads, self._prev) if g is not None])
        if not last:
            self._prev = [None if g is None else g.detach().clone() for g in grads]
        self.units.add(sq * (n_total / n_trips) ** 2, n_trips)
