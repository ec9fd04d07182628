"""Gradient accumulation whose step count k a scheduler chooses: the gradient noise scale (noise),
goodput and the LR rule (goodput), schedulers (Fixed, Goodput, RL), gymnasium environments (env),
the RL agent (agent), the trainer-side controller (controller) and the simulator's compute profile
(profile). Every name is importable from here (``from stfast.accum import WindowStats``); a submodule
is imported when one of its names is first used (gymnasium only with the environments)."""
from .._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "noise": ("GradientNoiseScale", "UnitGradients", "UnitNorms", "adam_preconditioner", "noise_estimates", "noise_kind",
              "squared_norm"),
    "goodput": ("StepTimeModel", "lr_scale", "statistical_efficiency"),
    "schedulers": ("AccumulationScheduler", "FixedScheduler", "GoodputScheduler", "RLScheduler",
                   "WindowStats", "log_goodput_gain", "make_scheduler", "observation", "parse_spec", "reward"),
    "agent": ("Agent", "goodput_model_q", "pretrained_agent", "train_offline"),
    "controller": ("AccumulationController",),
    "env": ("SimConfig", "SimulatedTrainingEnv", "randomized_config", "ring_allreduce_s", "rollout"),
    "profile": ("ComputeProfile", "NoiseCalibration"),
})
