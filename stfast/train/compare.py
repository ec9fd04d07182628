"""Two trained models scored on the same trips, and which is better: the gate of a model refresh (issue 63).

:func:`compare` reads the trips once (the incumbent's preprocessing, which the candidate must share: both must see
the same trips), predicts them with both models and reports each one's MAPE / MAE / RMSE and the paired
difference of MAPE with a 95 % percentile-bootstrap interval over trips (Efron & Tibshirani 1993, ch. 13: trips
resampled with replacement, both models' errors on a resampled trip kept together). :func:`promote` replaces a
served model file atomically. ``stfast compare CANDIDATE INCUMBENT --data RECENT [--min-gain G] [--promote PATH]``
exits 0 when the candidate is better, 1 when not: a gate for a cron job or CI.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .metrics import errors

BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the bootstrap interval (its percentiles move by ~0.1 % of its width between seeds at this many)."""


@dataclass
class Comparison:
    """The outcome of :func:`compare`. ``candidate`` / ``incumbent``: MAPE (fraction), MAE (s), RMSE (s) on the
    ``n_trips`` trips; ``gain``: incumbent MAPE − candidate MAPE (fraction; > 0: the candidate is better), with
    ``low`` / ``high`` its 95 % bootstrap interval; ``better``: ``low`` > ``min_gain`` (a model is never better
    than itself)."""

    n_trips: int
    candidate: dict
    incumbent: dict
    gain: float
    low: float
    high: float
    min_gain: float
    better: bool

    def lines(self, names: tuple[str, str] = ("candidate", "incumbent")) -> list[str]:
        """The human report: a row per model, the paired difference, the verdict."""
        w = max(len(n) for n in names)
        rows = [f"{name:<{w}}  MAPE {100 * m['mape']:6.2f} %  MAE {m['mae']:7.1f} s  RMSE {m['rmse']:7.1f} s"
                for name, m in zip(names, (self.candidate, self.incumbent))]
        rows.append(f"MAPE gain of the candidate (incumbent − candidate): {100 * self.gain:+.2f} points, 95 % "
                    f"interval [{100 * self.low:+.2f}, {100 * self.high:+.2f}] over {self.n_trips:,} trips "
                    f"(bootstrap, {BOOTSTRAP_RESAMPLES:,} resamples)")
        need = f"its interval's low end above --min-gain {100 * self.min_gain:g} points"
        rows.append(("better: " if self.better else "not better: ") + need
                    + ("" if self.better else f" (it is {100 * self.low:+.2f})"))
        return rows


def bootstrap_gain(ape_incumbent: np.ndarray, ape_candidate: np.ndarray, seed: int = 0,
                   resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of mean(ape_incumbent) − mean(ape_candidate), trips resampled with
    replacement (the pair of a trip kept together). ``ape_*``: [T] float64 absolute percentage errors (fractions),
    T ≥ 1. Deterministic for a ``seed``. Returns (low, high)."""
    d = np.asarray(ape_incumbent, np.float64) - np.asarray(ape_candidate, np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError(f"bootstrap_gain: [T] errors with T ≥ 1 needed, got shape {d.shape}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, (1 << 22) // len(d))  # ~32 MB of indices at a time
    for i in range(0, resamples, chunk):
        k = min(chunk, resamples - i)
        means[i:i + k] = d[rng.integers(0, len(d), (k, len(d)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def compare(pred_candidate: np.ndarray, pred_incumbent: np.ndarray, true: np.ndarray, min_gain: float = 0.0,
            seed: int = 0) -> Comparison:
    """Score two models' predictions [T] (s) of the same trips against their true travel times [T] (s).
    ``min_gain``: the MAPE gain (fraction) the candidate must show at the low end of its 95 % interval.
    Raises ValueError for mismatched lengths or no trip."""
    pc, pi, t = (np.asarray(x, np.float64) for x in (pred_candidate, pred_incumbent, true))
    if not (pc.shape == pi.shape == t.shape) or pc.ndim != 1 or len(t) == 0:
        raise ValueError(f"compare: predictions and true times of the same T ≥ 1 trips needed, got {pc.shape}, "
                         f"{pi.shape}, {t.shape}")
    ape_c, ape_i = np.abs(pc - t) / t, np.abs(pi - t) / t
    low, high = bootstrap_gain(ape_i, ape_c, seed)
    gain = float(ape_i.mean() - ape_c.mean())
    return Comparison(len(t), errors(pc, t), errors(pi, t), gain, low, high, min_gain, low > min_gain)


def promote(candidate: str | os.PathLike, target: str | os.PathLike) -> None:
    """Replace ``target`` by a copy of the checkpoint ``candidate``, atomically and durably: copied to a temporary
    file beside ``target``, fsynced, renamed over it, its folder fsynced (a reader of ``target`` — ``stfast serve
    --watch`` — sees the old file or the new one, never a part). Raises OSError; ValueError when ``target``'s folder
    does not exist or ``target`` is ``candidate`` itself."""
    from ..data.durable import atomic_file

    src, dst = Path(candidate), Path(target)
    if not dst.parent.is_dir():
        raise ValueError(f"--promote {dst}: no folder {dst.parent}")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"--promote {dst} is the candidate itself")
    with open(src, "rb") as f_in, atomic_file(dst) as f_out:
        shutil.copyfileobj(f_in, f_out, 1 << 20)
