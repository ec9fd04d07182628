"""The paced clock: a run's training time with every accumulation window timed at a typical pace instead of
the wall clock, so that runs made minutes apart on a machine whose speed drifts can be compared.

A window of ``trips`` trips run under a key (its k, or its mode and k) lasts trips / pace[key] on the paced
clock, where pace[key] is the median trips/s of every window with that key over the whole set of runs being
compared (all seeds, and all arms that share the key). The paced clock keeps what the key does to the
throughput (k = 4 takes fewer optimizer steps and all-reduces per trip than k = 1, and keeps that pace) and
what the run does statistically (its validation curve per trip), and removes when each run happened to be
made. Why it is needed here: on the 2-core VM of docs/accumulation.md one process at k = 1 ran at 150–750
trips/s within one 45 s run (§15), and a fixed arm's time to target varied ±10 % per seed, more than the 5 %
comparisons the benchmarks make (§16, §17).

What it hides: a difference in time per window between runs with the same key (a scheduler's own cost, a
slower code path). Benchmarks print the wall clock beside it, and measure such costs side by side
(benchmarks/accumulation.py --overhead).
"""
from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

#: one window of a run log: (its end on the run's wall clock, s; its key; trips; its own wall time, s)
Window = tuple[float, Hashable, int, float]


def pace_by_key(windows: Iterable[Window]) -> dict[Hashable, float]:
    """{key: median trips/s over the windows with that key} (windows of zero duration left out)."""
    rates: dict[Hashable, list[float]] = {}
    for _, key, trips, window_s in windows:
        if window_s > 0:
            rates.setdefault(key, []).append(trips / window_s)
    return {key: statistics.median(v) for key, v in rates.items()}


def paced_curve(curve: Sequence[tuple[float, float]], windows: Sequence[Window],
                pace: dict[Hashable, float]) -> list[tuple[float, float]]:
    """``curve`` ([(wall-clock s, value)], such as the validation MAPE per epoch) on the paced clock.

    Each window ends at Σ trips / pace[key] over the windows so far; a point between two window ends is
    interpolated linearly (a validation then takes the pace of the window around it), a point after the last
    window continues at that window's ratio of paced to wall time. Without windows the curve is returned as it
    is. Raises KeyError when a window's key has no pace."""
    if not windows:
        return list(curve)
    ends = np.array([0.0] + [w[0] for w in windows])
    paced = np.cumsum([0.0] + [trips / pace[key] for _, key, trips, _ in windows])
    tail = (paced[-1] - paced[-2]) / (ends[-1] - ends[-2]) if ends[-1] > ends[-2] else 1.0
    return [(float(np.interp(t, ends, paced)) if t <= ends[-1] else float(paced[-1] + (t - ends[-1]) * tail), v)
            for t, v in curve]
