"""The vocabulary of accumulation scheduling, shared by the schedulers, the RL agent and the simulator:
the choices of k, what one window of optimizer steps measured (WindowStats), the observation an agent
sees, the reward it earns, and the scheduler interface (observe a window, return the next k).

The trainer's controller (stfast.accum.controller) fills a WindowStats every window of W optimizer steps
on rank 0 and asks the scheduler for the next k; the simulator (stfast.accum.env) produces the same
WindowStats from its model of a cluster, so a policy trained there acts on live windows unchanged.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .goodput import statistical_efficiency

DEFAULT_CHOICES = (1, 2, 4, 8, 16)
OBS_NAMES = ("log_noise_over_micro_batch", "log_overhead_over_compute", "log_k", "comm_share", "budget_used",
             "loss_slope", "log_throughput", "imbalance")
OBS_DIM = len(OBS_NAMES)
NOISE_OBS_SCALE, OVERHEAD_OBS_SCALE = 8.0, 6.0  # observation(): log2 φ/B and log2 t_fixed/t_micro over these
SWITCH_GAIN = 0.05  # adaptive schedulers change k only for a predicted goodput gain above this (5 %)


@dataclass
class WindowStats:
    """What one window of optimizer steps measured.

    k: accumulation steps it ran with; micro_batch: global trips per micro-step (B); steps: optimizer
    steps; trips: trips processed (all ranks); wall_s: its wall time (s); comm_s: time inside the
    gradient all-reduce (s; includes waiting for the slowest rank); loss_slope: relative change of the
    EMA training loss over the window (negative while improving); noise_scale: B_simple in trips (nan
    when not yet estimable); budget_used: fraction of the run's budget spent, in [0, 1]; imbalance:
    the slicer's max/mean shard cost (1.0 without a slicer); overhead_s: the part of wall_s outside the
    micro-steps' forward + backward — the per-optimizer-step cost that accumulation amortizes (the
    all-reduce and waiting for the slowest rank, the optimizer step, the bookkeeping between steps); nan
    when not measured, and then comm_s stands in for it (see fixed_s)."""

    k: int
    micro_batch: int
    steps: int
    trips: int
    wall_s: float
    comm_s: float
    loss_slope: float = 0.0
    noise_scale: float = math.nan
    budget_used: float = 0.0
    imbalance: float = 1.0
    overhead_s: float = math.nan

    @property
    def fixed_s(self) -> float:
        """Per-window time that does not grow with k (s): overhead_s when measured, else comm_s."""
        return self.overhead_s if math.isfinite(self.overhead_s) else self.comm_s

    @property
    def samples_per_s(self) -> float:
        return self.trips / self.wall_s

    @property
    def k1_samples_per_s(self) -> float:
        """The k = 1 pace (trips/s) this window implies: its measured samples_per_s at k = 1; at k > 1 the
        step-time model's prediction, B·steps / (fixed_s + (wall_s − fixed_s)/k) (the forward + backward per
        micro-step measured here, the per-step overhead unchanged)."""
        if self.k == 1:
            return self.samples_per_s
        compute = max(self.wall_s - self.fixed_s, 0.0)
        return self.micro_batch * self.steps / max(self.fixed_s + compute / self.k, 1e-12)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    @property
    def comm_share(self) -> float:
        return min(self.comm_s / self.wall_s, 1.0)

    def goodput(self) -> float:
        """Efficiency-weighted samples per second (Pollux), in base-batch (k = 1) trips per second."""
        e = statistical_efficiency(self.noise_scale, self.k * self.micro_batch, self.micro_batch)
        return self.samples_per_s * e

    def to_dict(self) -> dict:
        d = asdict(self)
        d["window_s"] = d.pop("wall_s")  # "wall_s" in metrics.jsonl is the time since the start
        d.update(samples_per_s=self.samples_per_s, steps_per_s=self.steps_per_s, comm_share=self.comm_share)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def observation(stats: WindowStats, ref_samples_per_s: float | None = None, choices=DEFAULT_CHOICES) -> np.ndarray:
    """The RL observation [OBS_DIM] float32, each entry clipped to [-1, 1] (names in OBS_NAMES).

    The first two entries are what determines the best k (under the Pollux model the goodput of k
    is kB/(k·t_micro + t_fixed) · (φ + B)/(φ + kB), a function of φ/B and t_fixed/t_micro only):
    - log2(φ / B)/8: the gradient noise scale φ over the micro-batch B (both in trips); 0 when not
      yet estimable (nan), +1 when infinite (all noise so far: large batches lose nothing);
    - log2(t_fixed / t_micro)/6: time per optimizer step that does not grow with k (the all-reduce and
      waiting for the slowest rank, the optimizer step, bookkeeping; WindowStats.fixed_s) over the
      forward + backward per micro-step, both measured in the window (−1 without any).
    Then log2 k / log2 k_max, the communication share of the window, the budget used, 10·the
    relative loss slope, log2(samples_per_s / ref)/4 and imbalance − 1. Logarithms make the
    mapping scale-free: a GPU-class compute profile or another batch size shifts the inputs, it does
    not leave the range the policy was trained on.

    ref (trips/s): the k = 1 pace; None (what RLScheduler passes): the pace the same window implies
    (WindowStats.k1_samples_per_s), so the throughput entry is the window's own gain over k = 1 and a
    machine whose speed drifts during a run does not move it (a fixed first-window ref read a 2-core VM's
    drift, k = 1 windows at 150–750 trips/s within one 45 s run, as a loss of 0.7–1.0 in ln goodput;
    docs/accumulation.md, "The schedulers")."""
    k = stats.k
    if ref_samples_per_s is None:
        ref_samples_per_s = stats.k1_samples_per_s
    ns = stats.noise_scale
    if math.isnan(ns):
        noise = 0.0
    elif math.isinf(ns) and ns > 0:
        noise = 1.0
    else:
        noise = math.log2(max(ns, 1e-9) / stats.micro_batch) / NOISE_OBS_SCALE
    t_fixed = stats.fixed_s / max(stats.steps, 1)
    t_micro = max(stats.wall_s - stats.fixed_s, 1e-12) / (max(stats.steps, 1) * k)
    comm = math.log2(t_fixed / t_micro) / OVERHEAD_OBS_SCALE if t_fixed > 0 else -1.0
    thr = math.log2(stats.samples_per_s / ref_samples_per_s) / 4
    kmax = max(choices)
    obs = [noise, comm, math.log2(k) / math.log2(kmax) if kmax > 1 else 0.0, stats.comm_share,
           stats.budget_used, 10 * stats.loss_slope, thr, stats.imbalance - 1.0]
    return np.clip(np.nan_to_num(np.array(obs, dtype=np.float32)), -1.0, 1.0)


def log_goodput_gain(stats: WindowStats, ref_samples_per_s: float | None = None) -> float:
    """ln(goodput / ref): the window's goodput, samples_per_s·E(k·B), over the k = 1 pace (ref, trips/s;
    None: the pace this window implies, WindowStats.k1_samples_per_s, so the gain is 0 for a window at k = 1
    however fast the machine runs just then). What the RL agent maximizes per
    window: training progress is dP/dt = goodput(k, P), so choosing the k of the largest goodput at
    every moment maximizes the progress made by any time (the comparison principle for the scalar
    ODE), i.e. the per-window decision is a contextual bandit. The logarithm makes gains scale-free:
    a ×8 goodput where communication dominates does not drown a 3 % difference elsewhere."""
    if ref_samples_per_s is None:
        ref_samples_per_s = stats.k1_samples_per_s
    return math.log(max(stats.goodput(), 1e-300) / ref_samples_per_s)


def reward(stats: WindowStats, ref_samples_per_s: float) -> float:
    """The window's training progress beyond the k = 1 pace, over W·B base-batch trips:
    (trips·E(k·B) − ref·wall_s) / (steps·B), where a trip at batch M makes E(M) times the progress of
    one at the base batch (McCandlish et al.; stfast.accum.goodput) and ref is the k = 1 throughput
    (the first window's), at which E = 1. So a k = 1 window scores 0 and a window at k scores
    (goodput(k) − goodput(1)) × its wall time.

    Why this: the episode is a wall-clock budget, so the return — the sum over the budget — is the
    progress made within it (what reaching a target MAPE sooner needs) minus a constant, the progress
    of k = 1 in the same time. Subtracting that constant pace is potential-based shaping (Φ = −ref·t,
    Ng et al. 1999): it leaves the best policy unchanged but charges each window for the time it
    takes, so a long window at large k is not mistaken for a good one. A plain per-window rate summed
    over windows would count windows (their number depends on k); the EMA loss decrease per second
    falls over training whatever k is and is noisy per window."""
    e = statistical_efficiency(stats.noise_scale, stats.k * stats.micro_batch, stats.micro_batch)
    return (stats.trips * e - ref_samples_per_s * stats.wall_s) / (stats.steps * stats.micro_batch)


class AccumulationScheduler:
    """Base: ``k`` is the current choice; ``observe(stats) -> k`` decides the next window's."""

    def __init__(self, choices=DEFAULT_CHOICES, k0: int = 1):
        choices = tuple(int(c) for c in choices)
        if not choices or any(c < 1 for c in choices) or k0 not in choices:
            raise ValueError(f"choices must be positive and hold k0={k0}, got {choices}")
        self.choices = choices
        self.k = k0

    def observe(self, stats: WindowStats) -> int:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"k": self.k}

    def load_state_dict(self, s: dict) -> None:
        self.k = s["k"]
