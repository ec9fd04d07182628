"""Side-by-side timing shared by the kernel benchmarks' script modes: implementations are timed in
interleaved rounds (A, B, A, B, ...) after warm-up, so machine noise hits each alike and the ratio is
read within one run (developers' guide: speed lives in benchmarks, ratios measured side by side)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["sync", "time_side_by_side"]


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device == "cuda":
        torch.cuda.synchronize()


def time_side_by_side(runs: dict[str, Callable[[], object]], device: str, reps: int = 50, rounds: int = 7,
                      warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each callable in ``runs``: ``rounds`` interleaved rounds of ``reps``
    calls each, after ``warmup`` calls of each. On CUDA measured with CUDA events around the ``reps``
    calls (no host sync inside), on the CPU with ``time.perf_counter``."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    sync(device)
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    run()
                end.record()
                torch.cuda.synchronize()
                samples[k].append(start.elapsed_time(end) / 1e3 / reps)
            else:
                t0 = time.perf_counter()
                for _ in range(reps):
                    run()
                samples[k].append((time.perf_counter() - t0) / reps)
    return {k: statistics.median(v) for k, v in samples.items()}
