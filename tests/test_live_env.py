"""The live accumulation environment (stfast.train.live_env): a gymnasium environment that drives a Trainer."""
import math

import test_trainer
from gymnasium.utils.env_checker import check_env

from stfast.train.config import TrainConfig
from stfast.train.live_env import AccumulationEnv

trips_file = test_trainer.trips_file  # the fixture: 120 random trips


def test_live_accumulation_env_passes_check_env(trips_file, tmp_path):
    cfg = TrainConfig(data=trips_file, format="deeptte", batch_size=8, out=str(tmp_path), progress=False, threads=1,
                      accum_window=1)
    env = AccumulationEnv(cfg, budget_s=0.5)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    obs, r, term, _, info = env.step(1)  # k = 2
    assert env.observation_space.contains(obs) and info["k"] == 2 and info["trips"] == 16
    assert math.isfinite(r) and not term


def test_importing_stfast_accum_registers_both_environments_with_gymnasium(trips_file, tmp_path):
    """gymnasium.make creates the simulator and the live environment by their documented ids (registered on
    import of stfast.accum, whatever was imported before: test_exports runs the issue's line)."""
    import gymnasium

    import stfast.accum

    sim = gymnasium.make("stfast/AccumulationSim-v0")
    assert isinstance(sim.unwrapped, stfast.accum.SimulatedTrainingEnv)
    check_env(sim.unwrapped, skip_render_check=True)
    cfg = TrainConfig(data=trips_file, format="deeptte", batch_size=8, out=str(tmp_path), progress=False, threads=1,
                      accum_window=1)
    live = gymnasium.make("stfast/AccumulationLive-v0", cfg=cfg, budget_s=0.5)
    assert isinstance(live.unwrapped, AccumulationEnv) and live.unwrapped.budget_s == 0.5
    stfast.accum.register_environments()  # again: a no-op, no duplicate-registration warning
