"""Accuracy table: model variants × seeds on one split, beside both baselines.

    python benchmarks/accuracy.py --data ../shared/data/chengdu_deeptte_sample/test \
        --split-days 24-28/29/30 --seeds 0 1 2 3 4 \
        --variant paper="--head paper --loss mape" --variant prior="--head prior --loss log" --out runs/acc

Each run is `stfast train` with the variant's flags; the table reports, per variant, the median
(min–max) over seeds of the best validation MAPE and of test MAPE / MAE / RMSE. Select variants on
validation columns only; the test columns are for the candidates you would ship.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from stfast.cli import main as stfast_main


def _fmt(vals, pct=False):
    k = 100 if pct else 1
    vals = [k * v for v in vals]
    unit = " %" if pct else " s"
    return f"{statistics.median(vals):.1f}{unit} ({min(vals):.1f}–{max(vals):.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--variant", action="append", required=True, help='NAME="stfast train flags"')
    ap.add_argument("--out", default="runs/accuracy")
    ap.add_argument("--common", default="--epochs 40 --patience 10", help="flags for every run")
    ap.add_argument("--split-days", default=None)
    a = ap.parse_args(argv)
    rows, base = [], None
    for spec in a.variant:
        name, flags = spec.split("=", 1)
        res = []
        for seed in a.seeds:
            out = Path(a.out) / name / f"seed{seed}"
            args = ["train", "--seed", str(seed), "--out", str(out), "--no-progress", *shlex.split(a.common),
                    *shlex.split(flags)]
            if a.data:
                args += ["--data", a.data]
            if a.split_days:
                args += ["--split-days", a.split_days]
            if stfast_main(args) != 0:
                raise SystemExit(f"run failed: stfast {' '.join(args)}")
            res.append(json.load(open(out / "summary.json")))
        base = res[0]
        rows.append((name, flags, res))
    lines = ["| model | flags | best val MAPE | test MAPE | test MAE | test RMSE |", "|---|---|---|---|---|---|"]
    for name, flags, res in rows:
        lines.append(f"| {name} | `{flags}` | {_fmt([r['best_val_mape'] for r in res], True)} | "
                     f"{_fmt([r['test_mape'] for r in res], True)} | {_fmt([r['test_mae'] for r in res])} | "
                     f"{_fmt([r['test_rmse'] for r in res])} |")
    lines.append(f"| constant speed | fitted on train | | {100 * base['baseline_const_speed_mape']:.1f} % | "
                 f"{base['baseline_const_speed_mae']:.1f} s | {base['baseline_const_speed_rmse']:.1f} s |")
    lines.append(f"| mean travel time | fitted on train | | {100 * base['baseline_mean_time_mape']:.1f} % | "
                 f"{base['baseline_mean_time_mae']:.1f} s | {base['baseline_mean_time_rmse']:.1f} s |")
    table = "\n".join(lines)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
