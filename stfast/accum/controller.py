"""Gradient accumulation as a capability any training loop uses: per-step statistics (noise-scale
units, loss, time in the all-reduce), windows of W optimizer steps, the scheduler's decision on k, made on
rank 0 and summed over ranks by the caller's reduce function so that every rank takes the same number
of micro-steps (ranks that disagree would hang in the all-reduce), and the learning rate for k.

In one line of a loop: ``for micro in controller.micro_batches(loader): micro.backward(loss_of(micro.batch))``
(:meth:`AccumulationController.micro_batches`, examples/accumulation_loop.py) makes all its calls. Underneath,
a loop calls it at five places: before the first micro-step (begin_step), after each micro-step's backward
(after_micro_step), around the gradient all-reduce (extra, end_step), and after a window (window_due,
end_window); stfast's Trainer does just that (with its own gradient all-reduce over ranks).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .goodput import lr_scale
from .micro_batches import MicroBatch, _accumulate
from .noise import GradientNoiseScale, UnitGradients, adam_preconditioner, adam_trace_scale, noise_kind
from .schedulers import FixedScheduler, make_scheduler
from .window import AccumulationScheduler, WindowStats

LOSS_EMA_DECAY = 0.9  # per optimizer step
# optimizer steps between reads of Adam's preconditioner: v̂ (β₂ = 0.999) moves by well under 1 % in ten
# steps, and reading it is ~5 passes over the parameters (3 ms a read for DeepTTE on this CPU, 4 % of a step)
PRECOND_REFRESH_STEPS = 10


def rescale_second_moments(optimizer, factor: float) -> None:
    """Multiply Adam's (AdamW's) second-moment state (exp_avg_sq, and max_exp_avg_sq under amsgrad) of every
    parameter by ``factor``, in place; nothing for another optimizer, None, or factor 1."""
    if optimizer is None or factor == 1.0:
        return
    with torch.no_grad():
        for st in optimizer.state.values():
            for key in ("exp_avg_sq", "max_exp_avg_sq"):
                if torch.is_tensor(st.get(key)):
                    st[key].mul_(factor)


class AccumulationController:
    """Holds the scheduler (rank 0 decides), the gradient noise scale, the current window and the
    learning-rate rule for k.

    params: the model's parameters (for the micro-step gradient norms); micro_batch: global trips
    per micro-step (B); window: optimizer steps per decision (W); optimizer: the one stepping ``params``
    (its Adam second moments precondition the noise scale; None: plain only); noise_scale: which noise
    scale the scheduler reads, "adam" (B_adam = tr(PΣPᵀ)/|PG|², stfast.accum.noise, normalized to its k = 1
    value and calibrated per step: noise.adam_trace_scale) or "plain" (B_simple),
    None: adam under Adam/AdamW, else plain (stfast.accum.noise.noise_kind; raises ValueError as it does).
    Only that one is estimated (its cost: benchmarks/accumulation.py --overhead).

    Several ranks: ``reduce`` sums a float64 array over the ranks (every rank gets the sum; one small call
    per window, in the same order on every rank), ``world_size`` and ``rank`` (0 decides). Learning rate:
    after every change of k the optimizer's learning rate is ``lr`` · lr_scale(k, ``lr_scaling``) · the
    caller's schedule factor, from construction on (see apply_lr; ``lr`` None: the optimizer's at
    construction)."""

    def __init__(self, scheduler: AccumulationScheduler, params, micro_batch: int, window: int, optimizer=None,
                 noise_scale: str | None = None, *, reduce: Callable[[np.ndarray], np.ndarray] | None = None,
                 world_size: int = 1, rank: int = 0, lr: float | None = None, lr_scaling: str = "sqrt"):
        self.scheduler = scheduler
        self.params = list(params)
        self.reduce = reduce or (lambda a: a)
        self.distributed, self.is_main = world_size > 1, rank == 0
        self.micro_batch = micro_batch
        self.window = window
        self.k = scheduler.k
        self.optimizer = optimizer
        self.lr = lr if lr is not None or optimizer is None else optimizer.param_groups[0]["lr"]
        self.lr_scaling = lr_scaling
        self.lr_factor = 1.0  # the caller's schedule (apply_lr)
        self.noise_kind = noise_kind(noise_scale, optimizer)
        self.noise = GradientNoiseScale()  # B_adam or B_simple (noise_kind)
        self.units = UnitGradients(self.params)
        self._precond = None  # Adam's preconditioner (None: plain, or Adam still warming up)
        self._precond_age = 0  # optimizer steps since it was read
        self.loss_ema = math.nan
        self.n_windows = 0
        self.wall_before = 0.0  # training wall time of earlier invocations (resume), s
        self._t0 = time.perf_counter()
        self.clock_started = False  # start_clock called (micro_batches calls it on its first use)
        self._last_end = None  # perf_counter at the end of the last optimizer step (None: not counting)
        self.reset_window()
        self.apply_lr()  # the learning rate for the first k

    @classmethod
    def for_spec(cls, spec: str, seed: int, params, micro_batch: int, window: int, optimizer=None,
                 noise_scale: str | None = None, *, world_size: int = 1, rank: int = 0, pretrained: bool = True,
                 k0: int = 1, **kw) -> AccumulationController:
        """The controller of accumulation ``spec`` (schedulers.parse_spec's: "fixed:K", "goodput" or "rl"),
        its scheduler seeded with ``seed``, starting at ``k0`` (goodput and rl; --accum-start). Under "rl" only
        rank 0 holds the agent (the others start at k0 like it and follow its broadcast k); pretrained=False: its
        agent untrained, for a resume that loads the checkpoint's (schedulers.make_scheduler). ``kw``: the
        constructor's reduce, lr and lr_scaling."""
        sched = (make_scheduler(spec, seed=seed, pretrained=pretrained, k0=k0) if rank == 0 or spec != "rl"
                 else FixedScheduler(k0))
        return cls(sched, params, micro_batch, window, optimizer, noise_scale, world_size=world_size, rank=rank, **kw)

    def start_clock(self) -> None:
        """Training starts now: :meth:`elapsed` (and so a time budget) counts from here, added to the wall time
        of earlier invocations a resumed run recorded. Call it once, before the first step."""
        self._t0 = time.perf_counter()
        self.clock_started = True

    def micro_batches(self, batches: Iterable, budget_used: Callable[[], float] | None = None,
                      size: Callable[[Any], int] = len,
                      on_window: Callable[[dict], None] | None = None) -> Iterator[MicroBatch]:
        """Gradient accumulation in one line of a training loop (one process): iterate over ``batches``' items
        as :class:`MicroBatch`es, k to an optimizer step, k being this controller's (the scheduler's, updated
        every ``window`` steps), and call ``micro.backward(loss)`` with each micro-batch's mean loss::

            for micro in ctl.micro_batches(loader, size=lambda b: len(b[0])):
                x, y = micro.batch
                micro.backward(F.mse_loss(model(x), y))

        The iterator zeroes the gradients before a step's first micro-batch, and after its last backward steps
        the optimizer (this controller's), then closes the window when it is due (the scheduler's next k, the
        learning rate for it). Its decisions and parameters are those of the eight calls made by hand
        (stfast.accum.micro_batches). An epoch that ends mid-step (``batches`` runs out after j < k items):
        the last step takes those j micro-batches, weighted over their own samples; the window continues into
        the next call. Call it once per epoch, or once over an endless stream and ``break``.

        batches: any iterable (a DataLoader: one item = one micro-batch of about ``micro_batch`` samples).
        budget_used: the fraction of the training budget spent, in [0, 1], when a window closes (what the
        schedulers read; None: 0). size: the samples (trips) of an item, what weights its loss and the noise
        scale's units (``len``; a DataLoader's ``[x, y]`` batches have len 2: pass ``lambda b: len(b[0])``).
        on_window: called with each closed window's metrics (a dict: WindowStats' fields, ``loss_ema``,
        ``k_next``, ``noise_scale_point``).
        Raises ValueError (on first use): no optimizer, or several ranks (use the five calls there, around
        your gradient all-reduce); RuntimeError: an item not backpropagated through ``micro.backward``."""
        return _accumulate(self, batches, budget_used, size, on_window)

    def elapsed(self) -> float:
        """Wall time of training so far (s), over resumed invocations too (what --time-budget counts)."""
        return self.wall_before + time.perf_counter() - self._t0

    def reset_window(self) -> None:
        """A new window: its step, trip and time counters at zero, its loss start at the loss EMA."""
        self.w_steps, self.w_trips, self.w_wall, self.w_comm, self.w_compute = 0, 0, 0.0, 0.0, 0.0
        self.w_loss_start = self.loss_ema

    def restart_step_clock(self) -> None:
        """The time until the next step is not training (an epoch's validation and checkpoint): the next
        step's wall time counts from its own start, not from the end of the previous step."""
        self._last_end = None

    # ------------------------------------------------------------ per step
    @property
    def measuring(self) -> bool:
        """Whether this step's statistics count: always for plain, once Adam has warmed up for adam."""
        return self.noise_kind == "plain" or self._precond is not None

    def begin_step(self) -> None:
        """Before an optimizer step's first micro-step (after ``optimizer.zero_grad()``): the step's unit
        statistics start afresh, under Adam's preconditioner, re-read every PRECOND_REFRESH_STEPS steps."""
        if self.noise_kind == "adam" and (self._precond is None or self._precond_age >= PRECOND_REFRESH_STEPS):
            self._precond, self._precond_age = adam_preconditioner(self.optimizer, self.params), 0
        self._precond_age += 1
        self.units.begin(self._precond)

    def after_micro_step(self, n_shard: int, n_total: int, last: bool = False) -> None:
        """After each micro-step's backward: this rank's unit of ``n_shard`` trips (of the optimizer
        step's ``n_total``; ``last``: the step's last micro-step). Skipped for one micro-step on one rank,
        where no second batch size exists."""
        if (self.k > 1 or self.distributed) and self.measuring:
            self.units.after_micro_step(n_shard, n_total, last)

    def extra(self, local_loss: float) -> torch.Tensor:
        """The small vector summed inside the gradient all-reduce: [Σ|g_u|² (or Σ|P g_u|²), Σ1/b_u, U, loss]."""
        return torch.tensor([*self.units.units.as_array(), local_loss], dtype=torch.float64)

    def end_step(self, reduced: torch.Tensor, n_trips: int, step_s: float, sync_s: float,
                 compute_s: float = math.nan) -> None:
        """After the optimizer step: update the noise scale from the reduced statistics and |g|² of the
        reduced (mean over ``n_trips``) gradient, the loss EMA, and the window's counters.

        step_s: the step's own time (s); sync_s: its time in the all-reduce; compute_s: this rank's
        forward + backward time summed over its micro-steps (nan: not measured). The window counts each
        step's wall time from the end of the previous one, so the work between steps (the slicer's
        bookkeeping, metrics, collectives agreeing on stops) is charged to the steps, as it is per step."""
        now = time.perf_counter()
        wall = step_s if self._last_end is None else max(now - self._last_end, step_s)
        self._last_end = now
        red = reduced.double().numpy()
        if self.measuring:
            self._update_noise(red[:3], n_trips)
        loss = float(red[-1])
        self.loss_ema = loss if math.isnan(self.loss_ema) else LOSS_EMA_DECAY * self.loss_ema + (1 - LOSS_EMA_DECAY) * loss
        if math.isnan(self.w_loss_start):
            self.w_loss_start = loss
        self.w_steps += 1
        self.w_trips += n_trips
        self.w_wall += wall
        self.w_comm += sync_s
        self.w_compute += compute_s

    def _update_noise(self, units: np.ndarray, n_trips: int) -> None:
        """The noise scale from one step's reduced unit statistics [3] and the step's mean gradient in .grad
        (its norm over this controller's parameters, which need not be all of the model's:
        noise.noise_parameters); one process at k = 1 pairs the step with the previous one instead."""
        if not self.distributed and self.k == 1:
            paired = self.units.pair_with_previous(n_trips)
            if paired is None:
                return
            units, big_sq, n_trips = paired
        else:
            self.units.forget_previous()  # a later k = 1 step pairs with a k = 1 step only
            big_sq = self.units.norm([p.grad for p in self.params])
        self.noise.update(units, big_sq, n_trips, adam_trace_scale(self.k) if self._precond is not None else 1.0)

    # ------------------------------------------------------------ per window
    def window_due(self) -> bool:
        """Whether the window has its ``window`` optimizer steps (then :meth:`end_window`)."""
        return self.w_steps >= self.window

    def end_window(self, budget_used: float, out_of_time: bool, imbalance: float = 1.0) -> tuple[bool, dict | None]:
        """Close the window: rank 0 asks the scheduler for k; k and the stop flag are broadcast (one
        small reduce per window) and the learning rate set for the new k. Returns (stop, the window's
        metrics row on rank 0 else None)."""
        row = None
        decision = np.zeros(3)
        if self.is_main:
            stats = self.window_stats(budget_used, imbalance)
            k_next = self.scheduler.observe(stats)
            row = {"window": self.n_windows + 1, **stats.to_dict(), "loss_ema": self.loss_ema, "k_next": k_next,
                   "noise_kind": self.noise_kind}
            point = self.noise.value
            row["noise_scale_point"] = point if math.isfinite(point) else None
            r = getattr(self.scheduler, "last_reward", None)
            if r is not None and math.isfinite(r):
                row["reward"] = r
            decision[:] = (k_next, float(out_of_time), self.second_moment_factor(self.k, k_next))
        decision = self.reduce(decision)  # rank 0's: the others add zeros
        self.set_k(round(float(decision[0])), float(decision[2]))
        self.n_windows += 1
        self.reset_window()
        return bool(decision[1]), row

    # ------------------------------------------------------------ k and the learning rate
    def set_k(self, k: int, second_moment_factor: float | None = None) -> None:
        """Take ``k`` micro-steps per optimizer step from now on, at the learning rate for k (the window's
        decision, or a caller that chooses k itself, such as an RL environment). On a change of k, Adam's
        second moments are multiplied by ``second_moment_factor`` (None: second_moment_factor(old k, k))."""
        if k != self.k:
            f = self.second_moment_factor(self.k, k) if second_moment_factor is None else second_moment_factor
            rescale_second_moments(self.optimizer, f)
        self.k = k
        self.apply_lr()

    def second_moment_factor(self, k_old: int, k_new: int) -> float:
        """What a move from k_old to k_new accumulation steps does to E[g²], the mean square of the optimizer
        step's gradient: (|G|² + tr Σ/(k_new·B)) / (|G|² + tr Σ/(k_old·B)) = (1 + φ/(k_new·B)) / (1 + φ/(k_old·B)),
        with φ the noise scale's current bound (trips; k_old/k_new, the noise-dominated limit, while there is
        none). Adam's v̂ averages E[g²] over ~1/(1 − β₂) = 1,000 steps, far more than the tens a live run takes
        after a move: without this, after 1 → 4 its v̂ still held the k = 1 gradients' noise and its steps were
        too short (Chengdu, one process, six seeds: 0.95 point of validation MAPE behind fixed k = 4 over
        epochs 3–8, 0.49 with v̂ × 1/4; docs/accumulation.md, "A change of k rescales Adam's second moments").
        1.0 when k does not change."""
        if k_old == k_new:
            return 1.0
        phi = self.noise.lower_confidence() / self.micro_batch
        if not math.isfinite(phi):
            return k_old / k_new
        phi = max(phi, 0.0)  # a negative trace estimate is noise ≈ 0, not a factor that could turn v̂ negative
        return (1 + phi / k_new) / (1 + phi / k_old)

    def apply_lr(self, factor: float | None = None) -> None:
        """Set the optimizer's learning rate for the effective batch k·B: lr · lr_scale(k, lr_scaling) ·
        factor (stfast.accum.goodput.lr_scale: sqrt for Adam, linear for SGD, none). ``factor``: the caller's
        schedule (for example a cosine decay per epoch), kept for later changes of k; None: the last one.
        Without an optimizer nothing is set."""
        if factor is not None:
            self.lr_factor = factor
        if self.optimizer is None:
            return
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr * lr_scale(self.k, self.lr_scaling) * self.lr_factor

    def window_stats(self, budget_used: float, imbalance: float = 1.0) -> WindowStats:
        """This rank's measurements of the current window (its times; the loss and noise scale are global).
        Its noise scale is the lower confidence bound (GradientNoiseScale.lower_confidence) of the estimator
        of noise_kind: the point estimate jumps when the |G|² average passes near zero, and the schedulers
        would chase it."""
        slope = (self.loss_ema - self.w_loss_start) / abs(self.w_loss_start) if self.w_loss_start else 0.0
        return WindowStats(k=self.k, micro_batch=self.micro_batch, steps=self.w_steps, trips=self.w_trips,
                           wall_s=max(self.w_wall, 1e-9), comm_s=self.w_comm, loss_slope=slope,
                           overhead_s=max(self.w_wall - self.w_compute, 0.0),
                           noise_scale=self.noise.lower_confidence(), budget_used=min(max(budget_used, 0.0), 1.0),
                           imbalance=imbalance)

    # ------------------------------------------------------------ state
    WINDOW_FIELDS = ("w_steps", "w_trips", "w_wall", "w_comm", "w_compute", "w_loss_start")

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue the same decisions: k, the scheduler's state, the
        noise statistics, and the open window's counters (a checkpoint is usually written mid-window:
        --checkpoint-every, an epoch end), so the window the run was killed in closes after the same
        number of steps, with its steps before the kill counted."""
        return {"k": self.k, "scheduler": self.scheduler.state_dict(), "noise": self.noise.state_dict(),
                "noise_kind": self.noise_kind, "loss_ema": self.loss_ema, "n_windows": self.n_windows,
                "wall_before": self.elapsed(), "window": {f: getattr(self, f) for f in self.WINDOW_FIELDS}}

    def load_state_dict(self, s: dict) -> None:
        """Continue from :meth:`state_dict`'s ``s``: k, the scheduler (rank 0), the noise statistics (when of
        this controller's noise kind) and the open window's counters."""
        self.k, self.loss_ema, self.n_windows = s["k"], s["loss_ema"], s["n_windows"]
        self.wall_before = s["wall_before"]
        if self.is_main:
            self.scheduler.load_state_dict(s["scheduler"])
        # a checkpoint's estimate of the other kind (plain before 2026-12-01, or another --noise-scale) is not
        # this run's: then the estimate starts afresh
        if s.get("noise_kind", "plain") == self.noise_kind:
            self.noise.load_state_dict(s["noise"])
        self.reset_window()
        for f, v in s.get("window", {}).items():  # absent in checkpoints before issue 22: a fresh window
            setattr(self, f, v)
