"""Live training as a gymnasium environment for choosing the accumulation steps k: :class:`AccumulationEnv`
drives a :class:`~stfast.train.trainer.Trainer` through its public hooks (the accumulation controller's
``set_k`` — k and the learning rate for it — then ``Trainer.train_step`` per optimizer step).

Registered with gymnasium as "stfast/AccumulationLive-v0" (stfast.accum.registration). Spaces,
reward and episodes as the simulator's (stfast.accum.env, the RL vocabulary of stfast.accum.window): action
Discrete(len(choices)), an index into ``choices``; observation Box(-1, 1, (OBS_DIM,)); reward the window's progress beyond the k = 1 pace; an episode ends (truncated)
when its budget of training wall time is spent.
"""
from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from ..accum.registration import LIVE_ENV_ID
from ..accum.window import DEFAULT_CHOICES, OBS_DIM, WindowStats, log_goodput_gain, observation, reward
from .trainer import Trainer

class AccumulationEnv(gym.Env):
    """Live training as an environment: reset() builds a Trainer (seeded: model, batches) and returns
    the observation before any window (k = 1, nothing measured yet); step(action) runs the next W
    optimizer steps with k = choices[action] (batches continue across epochs) and returns the
    measured window. One process (world size 1). Wall-clock throughput makes it nondeterministic,
    which its spec declares (so check_env skips the step-determinism check).

    cfg: the TrainConfig (its accumulation spec is ignored: the agent chooses k); budget_s: the
    episode's budget of training wall time (s; evaluation excluded)."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, cfg, choices=DEFAULT_CHOICES, budget_s: float = 60.0):
        self.train_cfg = cfg
        self.choices = tuple(choices)
        self.budget_s = budget_s
        self.action_space = gym.spaces.Discrete(len(self.choices))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
        self.spec = EnvSpec(LIVE_ENV_ID, entry_point=f"{__name__}:AccumulationEnv", nondeterministic=True,
                            kwargs={"cfg": cfg, "choices": self.choices, "budget_s": budget_s})
        self.trainer: Trainer | None = None
        self.seed: int | None = None
        self.stream = iter(())
        self.time = 0.0
        self.ref: float | None = None

    def _batches(self):
        tr, epoch = self.trainer, 0
        while True:
            yield from tr.data.epoch_batches(self.train_cfg.batch_size, self.seed, epoch)
            epoch += 1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed = int(self.np_random.integers(2**31)) if seed is None else seed
        cfg = replace(self.train_cfg, seed=self.seed, accumulation="fixed:1", progress=False)
        self.trainer = Trainer(cfg)
        self.stream = self._batches()
        self.time = 0.0
        self.ref = None
        blank = WindowStats(k=1, micro_batch=cfg.batch_size, steps=1, trips=1, wall_s=1.0, comm_s=0.0)
        return observation(blank, 1.0, self.choices), {"k": 1}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in 0..{len(self.choices) - 1}, got {action!r}")
        tr = self.trainer
        k = self.choices[int(action)]
        tr.accum.set_k(k)  # and the learning rate for k
        tr.model.train()
        for _ in range(self.train_cfg.accum_window):
            group = [next(self.stream) for _ in range(k)]
            tr.train_step(group[0] if k == 1 else group, use_local=True)
        self.time += tr.accum.w_wall
        stats = tr.accum.window_stats(self.time / self.budget_s)
        tr.accum.reset_window()
        if self.ref is None:
            self.ref = stats.samples_per_s
        obs = observation(stats, None, self.choices)  # against this window's k = 1 pace, as RLScheduler observes
        info = {"k": k, **stats.to_dict(), "loss_ema": tr.accum.loss_ema, "log_goodput_gain": log_goodput_gain(stats)}
        return obs, float(reward(stats, self.ref)), False, self.time >= self.budget_s, info
