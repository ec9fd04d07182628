"""The gymnasium ids of stfast's accumulation environments, registered when stfast.accum is imported:

- ``stfast/AccumulationSim-v0``: the simulated cluster, stfast.accum.env.SimulatedTrainingEnv
  (``gymnasium.make("stfast/AccumulationSim-v0")``, or with its arguments: config, choices, randomize);
- ``stfast/AccumulationLive-v0``: live training, stfast.train.live_env.AccumulationEnv
  (``gymnasium.make("stfast/AccumulationLive-v0", cfg=TrainConfig(...), budget_s=60)``).

String entry points: gymnasium imports an environment's module only when it is made, so registering costs the
import of gymnasium alone (~0.06 s after torch) and this layer does not import the trainer above it.
"""
from __future__ import annotations

SIM_ENV_ID = "stfast/AccumulationSim-v0"
LIVE_ENV_ID = "stfast/AccumulationLive-v0"


def register_environments() -> None:
    """Register both environments with gymnasium's registry (again: a no-op)."""
    import gymnasium as gym

    for env_id, entry, nondeterministic in ((SIM_ENV_ID, "stfast.accum.env:SimulatedTrainingEnv", False),
                                            (LIVE_ENV_ID, "stfast.train.live_env:AccumulationEnv", True)):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry, nondeterministic=nondeterministic)
