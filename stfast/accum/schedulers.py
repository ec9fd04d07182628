"""Accumulation schedulers: one interface — observe the last window's statistics, return the next k
(micro-batches accumulated per optimizer step).

The trainer calls ``observe`` every window of W optimizer steps (on rank 0 only; it broadcasts k so
every rank takes the same number of micro-steps). Every scheduler has ``state_dict`` /
``load_state_dict`` so a resumed run continues its decisions. Build one from a CLI spec with
:func:`make_scheduler`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from .goodput import StepTimeModel, statistical_efficiency

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


class FixedScheduler(AccumulationScheduler):
    """Always k."""

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"accumulation steps must be ≥ 1, got {k}")
        super().__init__((k,), k)

    def observe(self, stats: WindowStats) -> int:
        return self.k


class GoodputScheduler(AccumulationScheduler):
    """Pollux/AdaptDL-style: choose argmax_k samples_per_s(k) · E(k·B) (see stfast.accum.goodput),
    with samples_per_s(k) from a step-time model fitted to the measured windows (k·t_micro + t_fixed)
    and E from the measured noise scale. Switches only when the predicted goodput gain over the
    current k exceeds ``min_gain`` (5 %), so measurement noise does not make k oscillate. Until a noise
    scale is measured (Adam's warm-up, the estimate's first steps) it keeps k."""

    def __init__(self, choices=DEFAULT_CHOICES, k0: int = 1, min_gain: float = SWITCH_GAIN):
        super().__init__(choices, k0)
        self.min_gain = min_gain
        self.times = StepTimeModel()
        self.noise_scale = math.nan

    def predicted_goodput(self, k: int, micro_batch: int) -> float:
        e = statistical_efficiency(self.noise_scale, k * micro_batch, micro_batch)
        return self.times.samples_per_s(k, micro_batch) * e

    def observe(self, stats: WindowStats) -> int:
        self.times.observe(stats.k, stats.wall_s / stats.steps, stats.fixed_s / stats.steps)
        if math.isfinite(stats.noise_scale):
            self.noise_scale = stats.noise_scale
        if math.isnan(self.noise_scale):
            # no noise scale yet: E = 1 at every k would make throughput alone decide, and it would run the
            # warm-up at the largest k, where large batches cost the most (early in training); every
            # configuration measures one now (one process at k = 1 by the differenced estimator)
            return self.k
        g = {k: self.predicted_goodput(k, stats.micro_batch) for k in self.choices}
        best = max(g, key=g.get)
        if g[best] > (1 + self.min_gain) * g[self.k]:
            self.k = best
        return self.k

    def state_dict(self) -> dict:
        return {"k": self.k, "times": self.times.state_dict(), "noise_scale": self.noise_scale}

    def load_state_dict(self, s: dict) -> None:
        self.k, self.noise_scale = s["k"], s["noise_scale"]
        self.times.load_state_dict(s["times"])


def observation(stats: WindowStats, ref_samples_per_s: float, choices=DEFAULT_CHOICES) -> np.ndarray:
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
    not leave the range the policy was trained on."""
    k = stats.k
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


def log_goodput_gain(stats: WindowStats, ref_samples_per_s: float) -> float:
    """ln(goodput / ref): the window's goodput, samples_per_s·E(k·B), over the k = 1 pace (ref: the
    k = 1 throughput, the first window's; 0 for a window at k = 1). What the RL agent maximizes per
    window: training progress is dP/dt = goodput(k, P), so choosing the k of the largest goodput at
    every moment maximizes the progress made by any time (the comparison principle for the scalar
    ODE), i.e. the per-window decision is a contextual bandit. The logarithm makes gains scale-free:
    a ×8 goodput where communication dominates does not drown a 3 % difference elsewhere."""
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


class RLScheduler(AccumulationScheduler):
    """A policy network (stfast.accum.agent) picks k from ``choices`` every window; the reward of
    each window (its log goodput gain, see :func:`log_goodput_gain`) is fed back and the agent is fine-tuned online every
    ``update_every`` windows, one minibatch step per window (agent.ONLINE_STEPS_PER_WINDOW; ``online=False``:
    act only). Like GoodputScheduler it keeps the current k
    unless another's predicted gain is 5 % larger (SWITCH_GAIN, on the log scale of its Q values),
    so noise in the observed noise scale does not make k oscillate; exploration tries k/2 or 2k."""

    def __init__(self, agent, choices=DEFAULT_CHOICES, k0: int = 1, online: bool = True, update_every: int = 8):
        super().__init__(choices, k0)
        if agent.n_actions != len(self.choices):
            raise ValueError(f"agent has {agent.n_actions} actions, choices are {self.choices}")
        self.agent = agent
        self.online = online
        self.update_every = update_every
        self.ref = math.nan  # samples/s of the first window
        self._pending = None  # (obs, action, logp, value) of the decision whose window just ran
        self.last_reward = math.nan
        self.noise_scale = math.nan  # the last finite noise-scale estimate

    def observe(self, stats: WindowStats) -> int:
        if not math.isfinite(self.ref):
            self.ref = stats.samples_per_s
        # a window without a finite estimate keeps the last one, for the observation and the reward alike
        # (as GoodputScheduler does): an unknown noise scale must not read as "large batches are free"
        if math.isfinite(stats.noise_scale):
            self.noise_scale = stats.noise_scale
        elif math.isfinite(self.noise_scale):
            stats = replace(stats, noise_scale=self.noise_scale)
        obs = observation(stats, self.ref, self.choices)
        if self._pending is not None and self.online:
            self.last_reward = log_goodput_gain(stats, self.ref)
            self.agent.record(*self._pending, self.last_reward, obs, False, stats.budget_used >= 1.0)
            if self.agent.n_recorded >= self.update_every:
                from .agent import ONLINE_STEPS_PER_WINDOW

                self.agent.update(ONLINE_STEPS_PER_WINDOW * self.agent.n_recorded)
        action, logp, value = self.agent.act(obs, current=self.choices.index(self.k),
                                               margin=math.log1p(SWITCH_GAIN))
        self._pending = (obs, action, logp, value)
        self.k = self.choices[action]
        return self.k

    def state_dict(self) -> dict:
        return {"k": self.k, "ref": self.ref, "agent": self.agent.state_dict(), "pending": self._pending,
                "noise_scale": self.noise_scale}

    def load_state_dict(self, s: dict) -> None:
        self.k, self.ref, self._pending = s["k"], s["ref"], s["pending"]
        self.noise_scale = s.get("noise_scale", math.nan)  # absent in checkpoints before 2026-11-30
        self.agent.load_state_dict(s["agent"])


def parse_spec(spec: str | None, nproc: int) -> str:
    """Normalize ``--accumulation``: None → "rl" when nproc > 1, else "fixed:1"; "K" → "fixed:K".
    Raises ValueError naming the bad value."""
    if spec is None:
        return "rl" if nproc > 1 else "fixed:1"
    s = spec.strip().lower()
    if s in ("goodput", "rl"):
        return s
    num = s.removeprefix("fixed:")
    if not num.isdigit() or int(num) < 1:
        raise ValueError(f"--accumulation must be K ≥ 1, fixed:K, goodput or rl, got {spec!r}")
    return f"fixed:{int(num)}"


def make_scheduler(spec: str, choices=DEFAULT_CHOICES, seed: int = 0, online: bool = True) -> AccumulationScheduler:
    """A scheduler from a normalized spec (see parse_spec). "rl" loads the agent pretrained on
    SimulatedTrainingEnv (trained on first use and cached, seconds)."""
    spec = parse_spec(spec, 1)
    if spec.startswith("fixed:"):
        return FixedScheduler(int(spec[6:]))
    if spec == "goodput":
        return GoodputScheduler(choices)
    from .agent import pretrained_agent

    return RLScheduler(pretrained_agent(choices, seed=seed), choices, online=online)
