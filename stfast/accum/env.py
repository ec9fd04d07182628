"""Gymnasium environments for choosing the accumulation steps k.

Both share the RL scheduler's spaces (stfast.accum.schedulers):
- action: Discrete(len(choices)), index into ``choices`` (default k ∈ {1, 2, 4, 8, 16});
- observation: Box(-1, 1, (OBS_DIM,), float32), see ``window.observation``/OBS_NAMES: log2(noise
  scale / B)/8, log2(t_fixed / t_micro)/6, log2 k / log2 k_max, communication share, budget used,
  10·loss slope, log2(samples_per_s / reference)/4, imbalance − 1;
- reward: the window's progress beyond the k = 1 pace, in base-batch trips over W·B
  (``window.reward``): 0 for a window at k = 1. info["log_goodput_gain"] is ln of the window's
  goodput over the k = 1 pace (``window.log_goodput_gain``), what the agent learns from;
- an episode: a wall-clock budget; each decision runs a window of W optimizer steps with the chosen
  k, and the episode is truncated when the budget is spent (no terminal state: training would go on).
  The return is then the progress made within the budget minus what k = 1 would have made.

SimulatedTrainingEnv is an analytic model (seconds for thousands of windows); the live environment,
which runs real training, is stfast.train.live_env.AccumulationEnv (it drives a Trainer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import gymnasium as gym
import numpy as np

from .goodput import statistical_efficiency
from .profile import ComputeProfile, NoiseCalibration
from .window import DEFAULT_CHOICES, OBS_DIM, WindowStats, observation


def ring_allreduce_s(n_bytes: float, ranks: int, bandwidth_gbps: float, latency_s: float) -> float:
    """Time of a ring all-reduce (s): 2(R−1) steps, each moving n_bytes/R over a link of
    ``bandwidth_gbps`` Gbit/s after ``latency_s`` (Patarasuk & Yuan 2009; the NCCL/Gloo ring)."""
    if ranks < 2:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * (latency_s + n_bytes / ranks / (bandwidth_gbps * 1e9 / 8))


@dataclass
class SimConfig:
    """The analytic training model.

    Time: an optimizer step with k micro-steps takes k·t_micro_s·imbalance + t_comm_s + t_opt_s
    (seconds: compute of the slowest rank, the gradient all-reduce, the optimizer step), each
    micro-step of ``micro_batch`` trips (all ranks).
    Progress P counts base-batch trips: a step at batch M = k·B adds M·E(M) with E from the noise
    scale (stfast.accum.goodput). Loss L(P) = L_inf + (L0 − L_inf)/(1 + P/P_s) (SGD on a convex
    problem); the noise scale grows as the excess loss shrinks, φ(P) = φ0·(1 + P/P_s) — near a
    minimum |G|² ∝ L − L_inf while tr(Σ) stays (McCandlish et al. 2018, §3) — so the best k grows
    during training. Observations are noisy like live ones: the noise-scale estimate by a lognormal
    factor (σ = obs_noise), throughput by thr_noise.

    The estimate is also biased like the live one (benchmarks/accumulation.py --calibrate, the numbers in
    profile_deeptte_cpu.json's "noise_calibration"): the live lower confidence bound of B_adam at k = 1
    (two units per step) is ``obs_bias`` times the noise scale that the runs' statistical efficiency shows
    (their epochs to a target at each k), and measured at k it is k^``obs_bias_k_exponent`` times its value
    at k = 1 (more units per step, a tighter bound). The defaults (1, 0) are an unbiased estimate."""

    t_micro_s: float
    t_comm_s: float
    t_opt_s: float = 0.0
    micro_batch: int = 64
    noise_scale0: float = 32.0
    progress_scale: float = 20000.0
    loss0: float = 1.0
    loss_inf: float = 0.1
    target_loss: float = 0.2
    window: int = 10
    budget_windows: float = 40.0  # the wall budget: this many windows at k = 1
    imbalance: float = 1.0
    obs_noise: float = 0.3
    thr_noise: float = 0.03
    obs_bias: float = 1.0
    obs_bias_k_exponent: float = 0.0

    @classmethod
    def from_profile(cls, profile: ComputeProfile, ranks: int, micro_batch: int, bandwidth_gbps: float = 25.0,
                     latency_s: float = 50e-6, **kw) -> SimConfig:
        """Calibrated from a measured compute profile plus a ring all-reduce over the given network."""
        return cls(t_micro_s=profile.micro_step_s(micro_batch / ranks), t_opt_s=profile.t_opt_s,
                   t_comm_s=ring_allreduce_s(profile.grad_bytes, ranks, bandwidth_gbps, latency_s),
                   micro_batch=micro_batch, **kw)

    def step_s(self, k: int) -> float:
        return k * self.t_micro_s * self.imbalance + self.t_comm_s + self.t_opt_s

    @property
    def budget_s(self) -> float:
        return self.budget_windows * self.window * self.step_s(1)

    def comm_share(self, k: int) -> float:
        return self.t_comm_s / self.step_s(k)

    def noise_scale(self, progress: float) -> float:
        return self.noise_scale0 * (1 + progress / self.progress_scale)

    def observed_noise_scale(self, progress: float, k: int, z: float) -> float:
        """What a live estimate at k reads (trips) for a standard normal draw ``z``: the noise scale times
        obs_bias · k^obs_bias_k_exponent and a lognormal factor exp(obs_noise · z)."""
        return (self.noise_scale(progress) * self.obs_bias * k ** self.obs_bias_k_exponent
                * math.exp(self.obs_noise * z))

    def loss(self, progress: float) -> float:
        return self.loss_inf + (self.loss0 - self.loss_inf) / (1 + progress / self.progress_scale)

    def goodput(self, k: int, progress: float) -> float:
        """Progress per second (base-batch trips/s) at k."""
        m = k * self.micro_batch
        return m * statistical_efficiency(self.noise_scale(progress), m, self.micro_batch) / self.step_s(k)


def default_sim_config() -> SimConfig:
    """The simulated run the RL agent pre-trains around (randomized_config varies it): two ranks, micro-batch
    64, the measured CPU compute profile (stfast/accum/profile_deeptte_cpu.json)."""
    return SimConfig.from_profile(ComputeProfile.load(), ranks=2, micro_batch=64)


def randomized_config(rng: np.random.Generator, base: SimConfig, calibration: NoiseCalibration | None = None) -> SimConfig:
    """Domain randomization for pre-training: the k = 1 communication share uniform in [0.01, 0.9],
    the initial noise scale 0.05–``phi0_max`` micro-batches and its growth over the episode ×1–×300 (both
    log-uniform), imbalance 1–1.3, and the live estimate's bias (SimConfig.obs_bias log-uniform and
    obs_bias_k_exponent uniform over ``calibration``'s measured ranges; None: unbiased, φ0 ≤ 4 batches).
    The policy sees only scale-free inputs (see window.observation), so the base's absolute times and
    batch size do not matter."""
    share = rng.uniform(0.01, 0.9)
    t_comm = share * (base.t_micro_s + base.t_opt_s) / (1 - share)
    phi0_max = 4.0 if calibration is None else calibration.phi0_max
    phi0 = base.micro_batch * math.exp(rng.uniform(math.log(0.05), math.log(phi0_max)))
    growth = math.exp(rng.uniform(0.0, math.log(300)))
    # P_s such that φ grows about ×growth when training at k = 1 for the whole episode
    base_trips = base.budget_windows * base.window * base.micro_batch
    bias = {}
    if calibration is not None:
        lo, hi = calibration.bias_range
        bias = {"obs_bias": math.exp(rng.uniform(math.log(lo), math.log(hi))),
                "obs_bias_k_exponent": rng.uniform(*calibration.k_exponent_range)}
    return replace(base, t_comm_s=t_comm, noise_scale0=phi0, progress_scale=base_trips / growth,
                   imbalance=rng.uniform(1.0, 1.3), **bias)


class SimulatedTrainingEnv(gym.Env):
    """Analytic training (see SimConfig). reset() runs a first window at k = 1 (as the live RL
    scheduler does) and returns its observation; each step(action) runs a window at k =
    choices[action]. ``randomize=True`` draws a new model per reset (randomized_config, with
    ``calibration``'s ranges of the live estimate's bias).
    ``last_stats``: the last window's WindowStats (noisy like a live measurement), so measurement-
    driven schedulers (GoodputScheduler) can run on it too.

    info: k, loss, time_s (simulated wall time), progress, window_progress, time_to_target_s (None
    until the loss reaches target_loss), best_k (the k of maximal true goodput now), log_goodput_gain
    (ln of the window's true goodput over the k = 1 pace)."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, config: SimConfig | None = None, choices=DEFAULT_CHOICES, randomize: bool = False,
                 calibration: NoiseCalibration | None = None):
        config = config if config is not None else default_sim_config()
        self.base = config
        self.calibration = calibration
        self.cfg = config
        self.choices = tuple(choices)
        self.randomize = randomize
        self.action_space = gym.spaces.Discrete(len(self.choices))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)

    # ------------------------------------------------------------ model
    def best_k(self) -> int:
        return max(self.choices, key=lambda k: self.cfg.goodput(k, self.progress))

    def best_action(self) -> int:
        return self.choices.index(self.best_k())

    def _window(self, k: int) -> tuple[np.ndarray, float]:
        """Run W steps at k; returns the observation and the progress made within the budget / (W·B)."""
        c = self.cfg
        loss_start, wall, gained, dt_in, made = c.loss(self.progress), 0.0, 0.0, 0.0, 0.0
        for _ in range(c.window):
            dt = c.step_s(k) * (1 + c.thr_noise * self.np_random.standard_normal())
            m = k * c.micro_batch
            dp = m * statistical_efficiency(c.noise_scale(self.progress), m, c.micro_batch)
            fits = min(max((c.budget_s - self.time) / dt, 0.0), 1.0)  # count only what fits the budget
            gained += dp * fits
            dt_in += dt * fits
            self.progress += dp
            made += dp
            wall += dt
            self.time += dt
            if math.isnan(self.time_to_target) and c.loss(self.progress) <= c.target_loss:
                self.time_to_target = self.time
        phi_hat = c.observed_noise_scale(self.progress, k, self.np_random.standard_normal())
        stats = WindowStats(k=k, micro_batch=c.micro_batch, steps=c.window, trips=c.window * k * c.micro_batch,
                            wall_s=wall, comm_s=c.window * c.t_comm_s, overhead_s=c.window * (c.t_comm_s + c.t_opt_s),
                            noise_scale=phi_hat,
                            loss_slope=(c.loss(self.progress) - loss_start) / loss_start,
                            budget_used=min(self.time / c.budget_s, 1.0), imbalance=c.imbalance)
        self.last_stats = stats  # what a scheduler measuring the window would see (e.g. GoodputScheduler)
        # rewards from the TRUE progress (what the agent should maximize); the observation carries the
        # noisy noise-scale estimate, as live
        self.last_progress = gained / (c.window * c.micro_batch)
        pace_1 = c.micro_batch / c.step_s(1)  # progress rate at k = 1 (E = 1 there), base-batch trips/s
        self.last_gain = math.log(made / wall / pace_1)
        return observation(stats, None, self.choices), (gained - pace_1 * dt_in) / (c.window * c.micro_batch)

    def _info(self, k: int) -> dict:
        return {"k": k, "loss": self.cfg.loss(self.progress), "time_s": self.time, "progress": self.progress,
                "window_progress": self.last_progress, "log_goodput_gain": self.last_gain,
                "time_to_target_s": None if math.isnan(self.time_to_target) else self.time_to_target,
                "best_k": self.best_k()}

    # ------------------------------------------------------------ gymnasium
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cfg = randomized_config(self.np_random, self.base, self.calibration) if self.randomize else self.base
        self.progress, self.time = 0.0, 0.0
        self.time_to_target = math.nan
        obs, _ = self._window(1)  # the first window runs at k = 1, as with the live RL scheduler
        return obs, self._info(1)

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in 0..{len(self.choices) - 1}, got {action!r}")
        k = self.choices[int(action)]
        obs, r = self._window(k)
        return obs, float(r), False, self.time >= self.cfg.budget_s, self._info(k)


def rollout(env: SimulatedTrainingEnv, policy, seed: int, until_target: bool = False) -> dict:
    """Run one episode with ``policy(env, obs) -> action``; returns the return (the sum of rewards:
    progress beyond the k = 1 pace), the progress within the budget (in k = 1 windows, the first
    window included), the k chosen per window, the simulated time at the end of each window and the
    time to the target loss. ``until_target``: keep stepping past the budget until the target is
    reached (at most 100 budgets), for time-to-target."""
    obs, info = env.reset(seed=seed)
    ret, progress, ks, times = 0.0, info["window_progress"], [], []
    while True:
        obs, r, _, trunc, info = env.step(policy(env, obs))
        ret += r
        progress += info["window_progress"]
        ks.append(info["k"])
        times.append(info["time_s"])
        reached = info["time_to_target_s"] is not None
        if trunc and (not until_target or reached or info["time_s"] > 100 * env.cfg.budget_s):
            break
    return {"return": ret, "progress": progress, "k": ks, "time_s": times,
            "time_to_target_s": info["time_to_target_s"]}
