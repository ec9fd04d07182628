"""Partition time of the slicer (csrc/slicer, stfast._slicer): the balanced slicer (LPT, Karmarkar–Karp
where shards are small, contiguous split, local search under the full model) against the plain
constructions, at 4,096 trips into 8 shards and 65,536 trips into 64 shards. Targets (issue 6): < 2 ms
and < 50 ms for the balanced slicer.

    pytest benchmarks/bench_slicer.py --benchmark-only --benchmark-group-by=param:size
"""
import numpy as np
import pytest

from stfast.parallel.slicer import LinearCostModel, partition, predicted_times

SIZES = {"4096x8": (4096, 8), "65536x64": (65536, 64)}
# A CPU fit of DeepTTE's forward + backward (benchmarks/slicer_imbalance.py --profile), rounded: every
# term is non-zero, so the local search works under the full, non-additive model.
MODEL = LinearCostModel((2e-3, 1e-4, 2e-5, 1e-6, 3e-5))


def batch_lengths(n: int, seed: int = 0) -> np.ndarray:
    """GeoLife-like lengths (points): log-normal, 3..600, heavy tail."""
    return np.clip(np.random.default_rng(seed).lognormal(2.8, 1.0, n), 3, 600).round()


@pytest.mark.parametrize("method", ["balanced", "lpt", "contiguous", "sorted", "equal"])
@pytest.mark.parametrize("size", list(SIZES))
def test_partition_time(benchmark, size, method):
    b, w = SIZES[size]
    lengths = batch_lengths(b)
    asg = benchmark(partition, lengths, w, method, MODEL)
    assert np.bincount(asg, minlength=w).min() >= 1 and len(asg) == b
    t = predicted_times(lengths, asg, w, MODEL)
    benchmark.extra_info["predicted_imbalance"] = float(t.max() / t.mean())
