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

With one process and one micro-step per optimizer step there are no two batch sizes within a step;
then the units are two CONSECUTIVE steps' gradients and the big batch their trip-weighted mean (a
differenced estimator, as AdaptDL does with one replica: tr(Σ) comes from |g_t − g_{t−1}|²). The
parameters moved by one step between the two, which adds |G_t − G_{t−1}|² to the trace estimate: small
next to tr(Σ)/b at the learning rates used here.

Under Adam (or AdamW) the step is P·g with P = diag(1/(√v̂ + ε)), v̂ its bias-corrected second moment,
and the noise that matters is that of the preconditioned gradient: the preconditioned noise scale
(Pollux: Qiao et al., OSDI 2021, §3.1, as AdaptDL computes it)

    B_adam = tr(P Σ Pᵀ) / |P G|²        (trips)

is the same estimator applied to P·g: every norm above weighted element-wise by P (read from the
optimizer's state once per step: :func:`adam_preconditioner`). Elements with v̂ = 0 (Adam has never seen a
gradient for them, such as the embedding rows of drivers not met yet) get weight 0: their 1/ε ≈ 1e8 would
swamp the rest. Measured offline with exact per-trip gradients (benchmarks/noise_scale_units.py), the plain
B_simple predicts E(4B) ≈ 0.3 for DeepTTE under Adam, B_adam 0.7–1.0, and live runs show ≈ 1.

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


NOISE_KINDS = ("adam", "plain")
# Adam steps before B_adam is estimated. v̂ from a handful of gradients is itself noise, and its smallest
# elements are the ones that dominate: units that rarely activate (√v̂ within a few ε, P ≈ 1/ε ≈ 1e8) turn any
# gradient they get into |P g|² of 1e10 or more. Measured live (synthetic city, k = 2, two ranks; docs/
# accumulation.md): reading P from the 5th step, Σ P² was 1.3e17 and the bound read 29,104 trips, decaying
# over 100 steps to the ~30 it settles at; reading it from the 50th, it read 6–41 from its first window.
ADAM_WARMUP_STEPS = 50


def noise_parameters(model) -> list:
    """The parameters the noise scale is estimated over: every parameter of ``model`` (a torch.nn.Module)
    except the weights of its torch.nn.Embedding layers, in module order.

    An embedding row has a gradient only on the steps whose trips hold its index (a driver, a time bin), so
    Adam's v̂ of a row met n times in t steps is about g²·n/t and the row's next gradient reads
    |P g| ≈ √(t/n): the rows of drivers seen once or twice swamp tr(PΣPᵀ). Measured live (Chengdu sample,
    two ranks, rl, after Adam's warm-up): the first B_adam bound read 2,148 trips with the embeddings and
    85 without, settling at 30–100 either way; the synthetic city read 237 and 7. The dense layers carry the
    noise that a larger batch averages."""
    import torch

    return [p for m in model.modules() if not isinstance(m, torch.nn.Embedding)
            for p in m.parameters(recurse=False)]


# What the Pollux efficiency model needs is the noise scale the runs' statistical efficiency shows, φ_eff (E(kB)
# = (φ + B)/(φ + kB) fitted to the epochs to a target at fixed k = 1, 2, 4, 8). The B_adam bound, normalized to
# k = 1, reads it low by the same order on both data sets measured (benchmarks/accumulation.py --live --calibrate,
# seeds 1–3, docs/accumulation.md, "The noise scale"): bound/φ_eff = 0.17 on the synthetic city, 0.068 on
# Chengdu; the schedulers read the bound × 1/√(0.17 · 0.068) = 9.3, their geometric mean (within 2.5× of either).
# Before the warm-up, the normalization and the embeddings' exclusion the two data sets' biases differed 15×, and
# no one factor fitted.
ADAM_BOUND_CALIBRATION = 9.3


def adam_trace_scale(k: int) -> float:
    """The factor on a step's tr(PΣPᵀ) estimate at k accumulation steps: ADAM_BOUND_CALIBRATION / k.

    1/k turns B_adam measured at k into its k = 1 value, what the goodput model E(kB) = (φ + B)/(φ + kB)
    takes. Adam's v̂ holds the noise of the step's own batch, so for an element whose gradient is mostly
    noise P² ≈ kB/σ² and its share of tr(PΣPᵀ) grows ∝ k, while the elements that carry |PG|² do not change:
    B_adam ∝ k. Measured live (fixed k = 1, 2, 4, 8): the bound grew ∝ k^0.8 on the synthetic city and
    ∝ k^1.03 on Chengdu; unnormalized, a move to a larger k raised the estimate and invited the next move up
    (goodput and rl climbed 2 → 4 → 16). ADAM_BOUND_CALIBRATION: see there."""
    return ADAM_BOUND_CALIBRATION / k


@dataclass
class UnitNorms:
    """Per-step accumulator of the small-batch statistics: Σ_u |g_u|² (or, preconditioned, Σ_u |P g_u|²),
    Σ_u 1/b_u and the unit count U (summed over micro-steps on a rank, then over ranks inside the gradient
    all-reduce)."""

    sq_sum: float = 0.0
    inv_size_sum: float = 0.0
    count: float = 0.0

    def add(self, mean_grad_sq: float, n_trips: int) -> None:
        """One unit: |g_u|² (or |P g_u|²) of its MEAN gradient over its ``n_trips`` (> 0) trips."""
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
        # updates before lower_confidence reports: the EMA's horizon 1/(1 − decay); a bound from two or three
        # steps read 1,435 trips on Chengdu before settling at 100–230 (docs/accumulation.md)
        self.min_updates = max(2, math.ceil(1.0 / (1.0 - decay) - 1e-9))
        self.g2_ema = 0.0
        self.g2_sq_ema = 0.0  # of the per-step |G|² estimates squared: their spread, for g2_stderr
        self.trace_ema = 0.0
        self.n = 0

    def update(self, units: np.ndarray, big_sq: float, b_big: float, trace_scale: float = 1.0) -> bool:
        """units: the all-reduced [Σ|g_u|², Σ1/b_u, U] (float64 [3]; for B_adam the preconditioned
        Σ|P g_u|² in place of Σ|g_u|², and |P g|² for big_sq); big_sq: |g|² of the step's mean
        gradient over its ``b_big`` trips; trace_scale: a factor on this step's tr(Σ) estimate (the
        controller's adam_trace_scale(k) for B_adam). Returns False (and changes nothing) when the
        step has fewer than two units, where the two batch sizes coincide."""
        sq_sum, inv_sum, count = (float(x) for x in units)
        if count < 2:
            return False
        b_small = count / inv_sum
        if not b_small < b_big:
            return False
        g2, trace = noise_estimates(sq_sum / count, b_small, big_sq, b_big)
        trace *= trace_scale
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
        """A conservative B_simple: tr(Σ) / (|G|² + z·stderr(|G|²)), in trips; nan before ``min_updates``
        updates (the EMA's horizon, 10 at decay 0.9) or while that denominator is ≤ 0. What the trainer's
        schedulers steer by.

        With two units per step (two ranks, k = 1) the per-step |G|² estimate is noisier than |G|² itself
        once B_simple exceeds the batch, and the point estimate ``value`` then jumps by orders of magnitude
        between windows as the EMA of |G|² passes near zero (5,319 trips after 129 four steps earlier, in
        a live Chengdu run); a scheduler reading that as "large batches are free" spends whole windows at
        k = 16. The bound instead grows as the evidence that |G|² is small accumulates, and errs toward a
        smaller noise scale — smaller k — when |G|² is uncertain. z = 2 is a one-sided ~98 % bound for a
        normal EMA."""
        se = self.g2_stderr
        if math.isnan(se) or self.n < self.min_updates:
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


def squared_norm(tensors, weights=None) -> float:
    """Σ‖t‖² over ``tensors`` (None entries skipped; 0.0 for none), accumulated in float64 with one
    fused norm per tensor group (``torch._foreach_norm``, as ``torch.nn.utils.clip_grad_norm_`` uses): it
    is inf or nan exactly when an element is (float32 or float16 gradients cannot overflow it).

    weights: None, or one tensor (the shape of its tensor) or None per tensor: then Σ‖w ⊙ t‖², a tensor
    whose weight is None left out (the preconditioned norm |P g|², P from :func:`adam_preconditioner`)."""
    import torch

    if weights is None:
        ts = [t for t in tensors if t is not None]
    else:
        pairs = [(t, w) for t, w in zip(tensors, weights, strict=True) if t is not None and w is not None]
        ts = torch._foreach_mul([t for t, _ in pairs], [w for _, w in pairs]) if pairs else []
    if not ts:
        return 0.0
    return float(torch.stack(torch._foreach_norm(ts, 2, dtype=torch.float64)).square().sum())


def noise_kind(choice: str | None, optimizer) -> str:
    """Which noise scale steers accumulation: ``choice`` ("adam" or "plain"), or for None "adam" when
    ``optimizer`` is torch.optim.Adam or AdamW and "plain" otherwise (SGD's step is the gradient itself).
    Raises ValueError for another choice, or "adam" without an Adam-family optimizer (no v̂ to read)."""
    import torch

    adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
    if choice is None:
        return "adam" if adam else "plain"
    if choice not in NOISE_KINDS:
        raise ValueError(f"--noise-scale must be adam or plain, got {choice!r}")
    if choice == "adam" and not adam:
        raise ValueError(f"--noise-scale adam needs an Adam or AdamW optimizer, got {type(optimizer).__name__}")
    return choice


def adam_preconditioner(optimizer, params, warmup: int = ADAM_WARMUP_STEPS) -> list | None:
    """Adam's (AdamW's) element-wise preconditioner P = 1/(√v̂ + ε) for each of ``params`` (tensors of its
    shape and dtype; v̂ = exp_avg_sq / (1 − β₂^step), max_exp_avg_sq under amsgrad), with 0 where v̂ = 0, and
    None for a parameter Adam holds no state for (never had a gradient): both are left out of the
    preconditioned norms. None while the optimizer has taken fewer than ``warmup`` steps. Read from the
    optimizer's state, no copy of it kept; about five element-wise passes over the parameters."""
    import torch

    group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
    out, steps = [], 0
    with torch.no_grad():
        for p in params:
            st, g = optimizer.state.get(p, {}), group_of.get(p)
            v = st.get("max_exp_avg_sq" if g is not None and g.get("amsgrad") else "exp_avg_sq")
            if v is None:
                out.append(None)
                continue
            step = float(st["step"])
            steps = max(steps, step)
            w = (v / (1.0 - g["betas"][1] ** step)).sqrt_().add_(g["eps"]).reciprocal_()
            out.append(w.masked_fill_(v == 0, 0.0))
    return out if steps >= warmup else None


def _foreach_mul(a: list, b: list) -> list:
    import torch

    return torch._foreach_mul(a, b) if a else []


def _stat_norm(tensors) -> float:
    """Σ‖t‖² for the noise statistics: per-tensor norms in the tensors' own precision (float32: a relative
    error of ~1e-7, far below the estimates' noise; a quarter faster than squared_norm's float64), summed
    in float64."""
    import torch

    ts = [t for t in tensors if t is not None]
    return float(torch.stack(torch._foreach_norm(ts, 2)).double().square().sum()) if ts else 0.0


def _difference(a, b):
    """a − b for tensors that may be None (a missing gradient: zero)."""
    if a is None or b is None:
        return None if a is None and b is None else (-b if a is None else a)
    return a - b


class UnitGradients:
    """Squared norms of each unit's mean gradient — plain, or preconditioned by P (B_adam) — read off the
    accumulating ``.grad`` of ``params`` between micro-steps (a copy of the gradient tensors after each
    micro-step but the last; no extra backward pass).

    Use: ``begin(precond)`` before the first micro-step (precond: :func:`adam_preconditioner`'s list, or
    None for the plain norms), ``after_micro_step(n)`` after each backward of a unit of n trips whose loss
    was its trip SUM divided by ``n_total`` (the optimizer step's trips), then ``units`` holds the step's
    UnitNorms. With one process and one micro-step per step, ``pair_with_previous`` after the step
    instead. Cost: one (plain) or two (P·g, then the norm) passes over the gradient per unit, plus the
    copy between micro-steps."""

    def __init__(self, params):
        self.params = list(params)
        self.units = UnitNorms()
        self.precond = None
        self._prev = None  # the .grad tensors (copies; None: no gradient yet) after the previous micro-step
        # pair_with_previous: (copies of the last step's mean gradient, its trips, its norm, the P it was taken with)
        self._prev_step = None

    def begin(self, precond=None) -> None:
        self.units = UnitNorms()
        self.precond = precond
        self._prev = None

    def norm(self, tensors) -> float:
        """Σ‖t‖² of per-parameter tensors, or Σ‖P t‖² with this step's preconditioner."""
        return _stat_norm(tensors if self.precond is None else self._scaled(tensors))

    def _scaled(self, tensors) -> list:
        """P ⊙ t per tensor (new tensors; None where the tensor or its weight is)."""
        pairs = [(i, t, w) for i, (t, w) in enumerate(zip(tensors, self.precond, strict=True))
                 if t is not None and w is not None]
        out = [None] * len(tensors)
        for (i, _, _), v in zip(pairs, _foreach_mul([t for _, t, _ in pairs], [w for _, _, w in pairs])):
            out[i] = v
        return out

    def forget_previous(self) -> None:
        """The next pair_with_previous starts a new pair (k changed, or the gradients were discarded)."""
        self._prev_step = None

    def pair_with_previous(self, n_trips: int) -> tuple[np.ndarray, float, int] | None:
        """The differenced estimator of one process at k = 1: this step's mean gradient g (``.grad``, over
        n = ``n_trips``) and the previous step's g' (over n') are two units, their trip-weighted mean the big
        batch: |w g + w' g'|² = w|g|² + w'|g'|² − w w'|g − g'|² (w = n/(n + n'), w' = 1 − w). Each step costs
        P ⊙ g, its norm, the difference to the previous step's P ⊙ g' (kept, with |P g'|²) and its norm: four
        passes over the gradient (plain: a copy of g instead of P ⊙ g). g' was scaled by the preconditioner of
        its own step (refreshed every few steps by the controller; v̂ moves by well under 1 % in between).
        Returns (units [3] as UnitNorms.as_array, |g_big|², b_big trips), or None for the first of a pair."""
        grads = [p.grad for p in self.params]
        if n_trips <= 0 or all(g is None for g in grads):  # nothing to pair: a new pair starts at the next step
            self._prev_step = None
            return None
        cur = ([None if g is None else g.detach().clone() for g in grads] if self.precond is None
               else self._scaled(grads))
        sq = _stat_norm(cur)
        prev, self._prev_step = self._prev_step, (cur, n_trips, sq)
        if prev is None:
            return None
        pg, n_prev, prev_sq = prev
        diff = [_difference(g, q) for g, q in zip(cur, pg)]
        total = n_prev + n_trips
        w, w_prev = n_trips / total, n_prev / total
        units = UnitNorms()
        units.add(prev_sq, n_prev)
        units.add(sq, n_trips)
        return units.as_array(), w * sq + w_prev * prev_sq - w * w_prev * _stat_norm(diff), total

    def after_micro_step(self, n_trips: int, n_total: int, last: bool = False) -> None:
        """Record the unit just backpropagated: its mean gradient is the change of .grad × n_total/n_trips.
        ``last``: no micro-step follows in this optimizer step, so .grad is not copied for the next one."""
        if n_trips <= 0:
            return
        grads = [p.grad for p in self.params]
        # per tensor, so no flat copy; a tensor whose first gradient came in this unit changed by all of it
        delta = grads if self._prev is None else [g if pv is None or g is None else g - pv
                                                  for g, pv in zip(grads, self._prev)]
        sq = self.norm(delta)
        if not last:
            self._prev = [None if g is None else g.detach().clone() for g in grads]
        self.units.add(sq * (n_total / n_trips) ** 2, n_trips)
