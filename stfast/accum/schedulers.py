"""Accumulation schedulers: fixed k and the goodput (Pollux-style) scheduler, and :func:`make_scheduler`,
which builds any of them — the RL agent's scheduler (stfast.accum.agent.RLScheduler) too — from a CLI spec.

Every scheduler implements stfast.accum.window.AccumulationScheduler: ``observe`` the last window's
WindowStats, return the next k (micro-batches accumulated per optimizer step). The trainer calls it every
window of W optimizer steps (on rank 0 only; it broadcasts k so every rank takes the same number of
micro-steps). Every scheduler has ``state_dict`` / ``load_state_dict`` so a resumed run continues its
decisions.
"""
from __future__ import annotations

import math

from .goodput import StepTimeModel, statistical_efficiency
from .window import DEFAULT_CHOICES, SWITCH_GAIN, AccumulationScheduler, WindowStats

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


# The default with several processes: the fastest mode to target of `stfast bench modes` at equal hardware on the
# Chengdu sample (dp + k = 2: 10.7 s against the RL scheduler's 15.7 s, 3 seeds, 60 s) and within noise of the RL
# scheduler on the synthetic city (57.7 against 59.1 s); docs/bench_modes.md, 2026-12-01 evening. rl and goodput
# stay one flag away.
DEFAULT_MULTI_PROCESS = "fixed:2"


def parse_spec(spec: str | None, nproc: int) -> str:
    """Normalize ``--accumulation``: None → "fixed:2" when nproc > 1 (DEFAULT_MULTI_PROCESS), else "fixed:1";
    "K" → "fixed:K". Raises ValueError naming the bad value."""
    if spec is None:
        return DEFAULT_MULTI_PROCESS if nproc > 1 else "fixed:1"
    s = spec.strip().lower()
    if s in ("goodput", "rl"):
        return s
    num = s.removeprefix("fixed:")
    if not num.isdigit() or int(num) < 1:
        raise ValueError(f"--accumulation must be K ≥ 1, fixed:K, goodput or rl, got {spec!r}")
    return f"fixed:{int(num)}"


def check_start(spec: str | None, k0: int, nproc: int, choices=DEFAULT_CHOICES) -> None:
    """``--accum-start k0`` is for an adaptive scheduler and must be one of its choices. Raises ValueError
    naming the flag."""
    if not parse_spec(spec, nproc) in ("goodput", "rl"):
        raise ValueError(f"--accum-start {k0} is the first k of --accumulation goodput or rl; a fixed k starts "
                         f"and stays at its own (--accumulation {spec or parse_spec(spec, nproc)[6:]})")
    if k0 not in choices:
        raise ValueError(f"--accum-start must be one of {', '.join(map(str, choices))}, got {k0}")


def make_scheduler(spec: str, choices=DEFAULT_CHOICES, seed: int = 0, online: bool = True,
                   pretrained: bool = True, k0: int = 1) -> AccumulationScheduler:
    """A scheduler from a normalized spec (see parse_spec). "rl" loads the agent pretrained on
    SimulatedTrainingEnv (trained on first use and cached per process, ~20 s on one core); pretrained=False
    builds it untrained, for a caller that loads a trained agent's state next (a resumed run). ``k0``: the first
    k of goodput and rl (one of ``choices``; a fixed spec ignores it). Raises ValueError: k0 not a choice."""
    spec = parse_spec(spec, 1)
    if spec.startswith("fixed:"):
        return FixedScheduler(int(spec[6:]))
    if spec == "goodput":
        return GoodputScheduler(choices, k0)
    from .agent import RLScheduler, pretrained_agent, residual_agent

    agent = pretrained_agent(choices, seed=seed) if pretrained else residual_agent(tuple(choices), seed)
    return RLScheduler(agent, choices, k0=k0, online=online)
