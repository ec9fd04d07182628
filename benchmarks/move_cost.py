"""What a move of the accumulation steps k costs in accuracy, free of timing: the validation MAPE per epoch of one
process at fixed k = 1, at fixed k = 4, and of runs that move from k = 1 to 4 after N optimizer steps, with and
without the rescale of Adam's second moments on the move (stfast.accum.controller.rescale_second_moments;
docs/accumulation.md, "A change of k rescales Adam's second moments").

    python benchmarks/move_cost.py --data ../shared/data/chengdu_deeptte_sample/test --seeds 10 11 12 13 14 15 \\
        --arms 1 4 move16 move60 move16:no-rescale move60:no-rescale --epochs 10 --out runs/move_cost

Every run: `--preset paper`, batch 32, window 4, `--ema-decay 0.97`, `--data-seed 0`, 1 thread. An arm ``moveN``
runs k = 1 until its N-th optimizer step and k = 4 from the window after it; ``:no-rescale`` leaves Adam's second
moments as they are on that move (the behaviour before 2026-12-02). Prints the mean validation MAPE per epoch of
each arm and its paired difference to fixed k = 4 over epochs 3–8 (mean over seeds, standard error).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path
from unittest import mock

from stfast.accum.window import AccumulationScheduler, WindowStats
from stfast.train.config import TrainConfig
from stfast.train.run_log import read_rows
from stfast.train.trainer import Trainer


class MoveAt(AccumulationScheduler):
    """k = 1 until ``at`` optimizer steps have run, then 4."""

    def __init__(self, at: int):
        super().__init__((1, 4), 1)
        self.at, self.steps = at, 0

    def observe(self, stats: WindowStats) -> int:
        self.steps += stats.steps
        self.k = 4 if self.steps >= self.at else 1
        return self.k


def run(arm: str, seed: int, data: str, epochs: int, out: Path) -> list[float]:
    """Validation MAPE per epoch (fractions) of one arm and seed."""
    move, _, option = arm.partition(":")
    cfg = TrainConfig(preset="paper", accumulation="fixed:4" if arm == "4" else "fixed:1", batch_size=32,
                      accum_window=4, seed=seed, data_seed=0, ema_decay=0.97, data=data, epochs=epochs, threads=1,
                      progress=False, out=str(out), overwrite=True)
    keep = mock.patch("stfast.accum.controller.rescale_second_moments", lambda opt, f: None)
    with keep if option else contextlib.nullcontext():
        tr = Trainer(cfg)
        if move.startswith("move"):
            tr.accum.scheduler = MoveAt(int(move[4:]))
        try:
            tr.fit()
        finally:
            tr.release_out_dir()
    return [r["val_mape"] for r in read_rows(out)["epoch"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12, 13, 14, 15])
    ap.add_argument("--arms", nargs="+", default=["1", "4", "move16", "move60", "move16:no-rescale",
                                                  "move60:no-rescale"])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out", default="runs/move_cost")
    a = ap.parse_args(argv)
    for arm in a.arms:
        move, _, option = arm.partition(":")
        if not (move in ("1", "4") or (move.startswith("move") and move[4:].isdigit())) or option not in ("", "no-rescale"):
            ap.error(f"--arms: {arm!r} is not 1, 4, moveN or moveN:no-rescale")
    curves = {arm: {} for arm in a.arms}
    for seed in a.seeds:  # seed-major: an interrupted run has every arm on the first seeds
        for arm in a.arms:
            curves[arm][seed] = run(arm, seed, a.data, a.epochs, Path(a.out) / f"{arm.replace(':', '_')}_s{seed}")
            print(arm, seed, " ".join(f"{100 * m:.2f}" for m in curves[arm][seed]), flush=True)
    print("\n| arm | " + " | ".join(f"epoch {e + 1}" for e in range(a.epochs)) + " | − k = 4, epochs 3–8 (se) |")
    print("|---" * (a.epochs + 2) + "|")
    for arm in a.arms:
        mean = [100 * statistics.mean(curves[arm][s][e] for s in a.seeds) for e in range(a.epochs)]
        diff = "–"
        if "4" in curves and arm != "4" and len(a.seeds) > 1:
            d = [100 * statistics.mean(curves[arm][s][e] - curves["4"][s][e] for e in range(2, min(8, a.epochs)))
                 for s in a.seeds]
            diff = f"{statistics.mean(d):+.2f} ({statistics.stdev(d) / len(d) ** 0.5:.2f})"
        print(f"| {arm} | " + " | ".join(f"{m:.2f}" for m in mean) + f" | {diff} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
