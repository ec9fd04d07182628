"""Gradient accumulation whose step count k a scheduler chooses: the gradient noise scale (noise),
goodput and the LR rule (goodput), what a window measures, observes and earns (window), schedulers (Fixed,
Goodput; schedulers), the RL agent and its scheduler (agent), gymnasium environments (env), the
controller any training loop uses (controller; in one line of it: ``for micro in controller.micro_batches(
loader)``, micro_batches) and the simulator's compute profile (profile). Every name is importable from here
(``from stfast.accum import WindowStats``); a submodule is imported when one of its names is first used.

Importing it registers the gymnasium environments (``gymnasium.make("stfast/AccumulationSim-v0")``, the
simulated cluster; ``"stfast/AccumulationLive-v0"``, live training; see registration)."""
from .._lazy import lazy_exports
from .registration import register_environments

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "noise": ("GradientNoiseScale", "UnitGradients", "UnitNorms", "adam_preconditioner", "adam_trace_scale",
              "noise_estimates", "noise_kind", "noise_parameters", "squared_norm"),
    "goodput": ("StepTimeModel", "lr_scale", "statistical_efficiency"),
    "window": ("AccumulationScheduler", "WindowStats", "log_goodput_gain", "observation", "reward"),
    "schedulers": ("FixedScheduler", "GoodputScheduler", "check_start", "make_scheduler", "parse_spec"),
    "agent": ("Agent", "RLScheduler", "goodput_model_q", "pretrained_agent", "residual_agent", "train_offline"),
    "controller": ("AccumulationController", "rescale_second_moments"),
    "micro_batches": ("MicroBatch",),
    "env": ("SimConfig", "SimulatedTrainingEnv", "default_sim_config", "randomized_config", "ring_allreduce_s",
            "rollout"),
    "registration": ("register_environments",),
    "profile": ("ComputeProfile", "NoiseCalibration"),
})

register_environments()
