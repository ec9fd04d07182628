"""Gradient accumulation whose step count k a scheduler chooses: the gradient noise scale (noise),
goodput and the LR rule (goodput), what a window measures, observes and earns (window), schedulers (Fixed,
Goodput; schedulers), the RL agent and its scheduler (agent), gymnasium environments (env), the
trainer-side controller (controller) and the simulator's compute profile (profile). Every name is
importable from here (``from stfast.accum import WindowStats``); a submodule is imported when one of its
names is first used.

The gymnasium environments are registered as ``stfast/AccumulationSim-v0`` (the simulated cluster,
SimulatedTrainingEnv) and ``stfast/AccumulationLive-v0`` (live training, AccumulationEnv:
``gymnasium.make("stfast/AccumulationLive-v0", cfg=TrainConfig(...), budget_s=60)``) when stfast.accum is
imported after gymnasium, or when stfast.accum.env is imported; a training run that never touches
gymnasium does not pay for importing it."""
import sys

from .._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "noise": ("GradientNoiseScale", "UnitGradients", "UnitNorms", "adam_preconditioner", "adam_trace_scale",
              "noise_estimates", "noise_kind", "noise_parameters", "squared_norm"),
    "goodput": ("StepTimeModel", "lr_scale", "statistical_efficiency"),
    "window": ("AccumulationScheduler", "WindowStats", "log_goodput_gain", "observation", "reward"),
    "schedulers": ("FixedScheduler", "GoodputScheduler", "make_scheduler", "parse_spec"),
    "agent": ("Agent", "RLScheduler", "goodput_model_q", "pretrained_agent", "residual_agent", "train_offline"),
    "controller": ("AccumulationController",),
    "env": ("SimConfig", "SimulatedTrainingEnv", "default_sim_config", "randomized_config", "register_environments",
            "ring_allreduce_s", "rollout"),
    "profile": ("ComputeProfile", "NoiseCalibration"),
})

if "gymnasium" in sys.modules:  # gymnasium.make(...) may follow: the environments must be in its registry
    from .env import register_environments

    register_environments()
