"""The compute profile of one DeepTTE micro-step on this machine, which calibrates
SimulatedTrainingEnv: t_micro(b) = t_fixed + b·t_per_trip for b trips on one rank (forward +
backward), the optimizer step t_opt, and the gradient's size in bytes (what an all-reduce moves).

Measure and store:  python -m stfast.accum.profile --out stfast/accum/profile_deeptte_cpu.json
(the file records the command, the machine and the raw timings next to the fitted numbers).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_PATH = Path(__file__).with_name("profile_deeptte_cpu.json")


@dataclass
class NoiseCalibration:
    """How the live noise-scale estimate relates to the statistical efficiency live runs show (measured by
    ``python benchmarks/accumulation.py --calibrate RUNS``; stored as "noise_calibration" in the profile
    JSON with the runs it came from). bias_range: [lo, hi] of (the lower confidence bound of B_adam at
    k = 1) / (the noise scale φ_eff whose Pollux efficiency E(kB) = (φ + B)/(φ + kB) fits the runs' epochs
    to target at each k), over the measured data sets; k_exponent_range: [lo, hi] of α in
    estimate(k) / estimate(1) = k^α; phi0_max: the largest φ_eff seen, in micro-batches (the simulator's
    range of noise scales reaches it)."""

    bias_range: tuple[float, float]
    k_exponent_range: tuple[float, float]
    phi0_max: float

    @classmethod
    def load(cls, path: str | os.PathLike = None) -> NoiseCalibration | None:
        """The stored calibration, None when the profile has none."""
        d = json.loads(Path(path or DEFAULT_PATH).read_text()).get("noise_calibration")
        if d is None:
            return None
        return cls(tuple(d["bias_range"]), tuple(d["k_exponent_range"]), float(d["phi0_max"]))


@dataclass
class ComputeProfile:
    """t_fixed_s + b·t_per_trip_s: one rank's forward + backward of b trips (s); t_opt_s: one Adam
    step (s); grad_bytes: the gradient all-reduced per optimizer step (bytes)."""

    t_fixed_s: float
    t_per_trip_s: float
    t_opt_s: float
    grad_bytes: int

    def micro_step_s(self, trips_per_rank: float) -> float:
        return self.t_fixed_s + trips_per_rank * self.t_per_trip_s

    @classmethod
    def load(cls, path: str | os.PathLike = DEFAULT_PATH) -> ComputeProfile:
        """The fitted numbers of a stored profile. Raises FileNotFoundError naming the path."""
        d = json.loads(Path(path).read_text())
        return cls(**{k: d[k] for k in ("t_fixed_s", "t_per_trip_s", "t_opt_s", "grad_bytes")})


def measure(sizes=(4, 16, 64), repeats: int = 5, n_trips: int = 2000, seed: int = 0) -> dict:
    """Time forward + backward of DeepTTE (float32, fused kernels, the synthetic city) at each micro-batch
    size (median of ``repeats``), fit t_fixed + b·t_per_trip by least squares, time the Adam step."""
    import torch

    from ..data.dataset import DriverVocab, NormStats, TripDataset
    from ..data.synthetic import synthetic_trips
    from ..models.deeptte import DeepTTE, DeepTTEConfig, local_count, training_loss

    torch.manual_seed(seed)
    trips = synthetic_trips(n_trips, seed=seed)
    vocab = DriverVocab(trips.driver)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    ds = TripDataset(trips, vocab, torch.float32)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    rng = np.random.default_rng(seed)
    raw = {}
    for b in sizes:
        times = []
        for r in range(repeats + 1):  # the first is a warm-up
            idx = rng.choice(len(trips), b, replace=False)
            batch = ds.batch(idx)
            t0 = time.perf_counter()
            training_loss(model, model(batch), batch, b, local_count(ds.lengths[idx], model.cfg.kernel_size)).backward()
            if r:
                times.append(time.perf_counter() - t0)
        raw[b] = float(np.median(times))
    t_opt = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        t_opt.append(time.perf_counter() - t0)
    slope, intercept = np.polyfit(list(raw), list(raw.values()), 1)
    grad_bytes = sum(p.numel() for p in model.parameters()) * 4
    return {"t_fixed_s": float(max(intercept, 0.0)), "t_per_trip_s": float(slope), "t_opt_s": float(np.median(t_opt)),
            "grad_bytes": int(grad_bytes), "raw_fwd_bwd_s": {str(k): v for k, v in raw.items()},
            "torch_threads": torch.get_num_threads(), "machine": f"{platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, {platform.platform()}", "torch": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", default=str(DEFAULT_PATH))
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    prof = measure(repeats=a.repeats)
    omp = os.environ.get("OMP_NUM_THREADS")
    prof["command"] = ((f"OMP_NUM_THREADS={omp} " if omp else "") + "python -m stfast.accum.profile "
                       + " ".join(argv if argv is not None else sys.argv[1:]))
    prof["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    prof["note"] = "machine shared with other jobs while measured: timings are noisy upper bounds"
    out = Path(a.out)
    if out.is_file() and "noise_calibration" in (old := json.loads(out.read_text())):
        prof["noise_calibration"] = old["noise_calibration"]  # measured by another command: kept
    out.write_text(json.dumps(prof, indent=2) + "\n")
    print(json.dumps(prof, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
