"""The paced clock: a run's training time with every accumulation window timed at a typical pace instead of
the wall clock, so that runs made minutes apart on a machine whose speed drifts can be compared.

The paced clock counts training time only. A window of ``trips`` trips run under a key (its k, or its mode
and k) lasts trips / pace[key] on it, where pace[key] is the median trips/s of every window with that key over
the whole set of runs being compared (all seeds, and all arms that share the key). It keeps what the key does
to the throughput (k = 4 takes fewer optimizer steps and all-reduces per trip than k = 1, and keeps that pace)
and what the run does statistically (its validation curve per optimizer step); it removes when each run
happened to be made, and the time validation takes. Why it is needed here: on the 2-core VM of
docs/accumulation.md one process at k = 1 ran at 150–750 trips/s within one 45 s run, and a fixed arm's
time to target varied ±10 % per seed, more than the 5 % comparisons the benchmarks make (docs/accumulation.md,
"Results (paced clock)").

What it hides: a difference in time per window between runs with the same key (a scheduler's own cost, a
slower code path). Benchmarks print the wall clock beside it, and measure such costs side by side
(benchmarks/accumulation.py --overhead).
"""
from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

#: one window of a run log: (the optimizer step it ends at; its key; trips; its own wall time, s)
Window = tuple[int, Hashable, int, float]


def pace_by_key(windows: Iterable[Window]) -> dict[Hashable, float]:
    """{key: median trips/s over the windows with that key} (windows of zero duration left out)."""
    rates: dict[Hashable, list[float]] = {}
    for _, key, trips, window_s in windows:
        if window_s > 0:
            rates.setdefault(key, []).append(trips / window_s)
    return {key: statistics.median(v) for key, v in rates.items()}


def paced_curve(curve: Sequence[tuple[int, float]], windows: Sequence[Window],
                pace: dict[Hashable, float]) -> list[tuple[float, float]]:
    """``curve`` ([(optimizer step, value)], such as the validation MAPE after each epoch's last step) on the
    paced clock: [(paced s, value)].

    The paced clock counts training only: each window lasts trips / pace[key] (its own wall time when its key
    has no pace), a point is placed by its optimizer step, linearly between the steps the windows end at, and
    after the last window at that window's paced time per step. Validation and checkpoints take no paced time,
    whatever their position among the windows. Raises ValueError without windows (no training to time)."""
    if not windows:
        raise ValueError("a paced curve needs the run's windows")
    ends = np.array([0] + [w[0] for w in windows], dtype=float)
    paced = np.cumsum([0.0] + [trips / pace[key] if pace.get(key) else window_s
                               for _, key, trips, window_s in windows])
    per_step = (paced[-1] - paced[-2]) / (ends[-1] - ends[-2]) if ends[-1] > ends[-2] else 0.0
    return [(float(np.interp(step, ends, paced)) if step <= ends[-1] else float(paced[-1] + (step - ends[-1]) * per_step),
             v) for step, v in curve]
