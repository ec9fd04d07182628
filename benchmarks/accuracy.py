"""Accuracy table: model variants × seeds on one split, beside both baselines.

    python benchmarks/accuracy.py --data ../shared/data/chengdu_deeptte_sample/test \
        --split-days 24-28/29/30 --seeds 0 1 2 3 4 \
        --variant paper="--preset paper" --variant real="--preset real" --plot runs/acc/curves.png --out runs/acc

Each run is `stfast train` with the variant's flags (``--reuse`` keeps runs whose summary.json exists);
the table reports, per variant, the median (min–max) over seeds of the best validation MAPE and of test
MAPE / MAE / RMSE. ``--ensemble K`` adds a row per variant for seed ensembles: consecutive groups of K
seeds (seeds 0–4, 5–9, ... with K = 5), each group's mean prediction scored on validation and test,
median (min–max) over groups. Select variants on validation columns only; the test columns are for the
candidates you would ship. ``--plot PNG`` draws each variant's validation MAPE per epoch (median over seeds,
the seeds' range shaded) beside constant speed's. Under ``stfast train``'s default ``--preset auto`` a file's
runs take the real-data defaults for every flag a variant does not give: start a variant with
``--preset paper`` to vary the paper's configuration. ``--precision 32 bf16-mixed`` runs every variant in each
precision (rows "NAME, bf16-mixed"; stfast.train.precision) and adds, per variant, the difference of the median
test MAPEs against the first precision; the "beat constant speed" column counts the seeds whose test MAPE is below
constant speed's on that seed's split (issue 44's acceptance of bf16-mixed: 5 seeds of the default `stfast train`, within 0.5 points):

    python benchmarks/accuracy.py --data ../shared/data/chengdu_deeptte_sample/test --common "--split-by date" \
        --variant default="" --precision 32 bf16-mixed --out runs/acc_precision
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


def _row(name, flags, val_mape, test, const_mape=None):
    """``const_mape``: each run's constant-speed test MAPE (a random split differs by seed)."""
    beat = "" if const_mape is None else f"{sum(t['mape'] < c for t, c in zip(test, const_mape))}/{len(test)}"
    return (f"| {name} | `{flags}` | {_fmt(val_mape, True)} | {_fmt([t['mape'] for t in test], True)} | "
            f"{_fmt([t['mae'] for t in test])} | {_fmt([t['rmse'] for t in test])} | {beat} |")


def _ensembles(run_dirs: list[Path], k: int, a) -> tuple[list[float], list[dict]]:
    """Validation MAPEs and test metrics of the seed ensembles (consecutive groups of k runs)."""
    from stfast.data.load import load_trips
    from stfast.train.config import TrainConfig
    from stfast.train.ensemble import predict_ensemble
    from stfast.train.metrics import errors
    from stfast.train.run_data import split_trips

    cfg = TrainConfig(data=a.data, split_days=a.split_days)
    _, val, test = split_trips(load_trips(a.data), cfg)
    vals, tests = [], []
    for g in range(0, len(run_dirs) - k + 1, k):
        ckpts = [d / "checkpoint.pt" for d in run_dirs[g:g + k]]
        vals.append(errors(predict_ensemble(ckpts, val), val.time)["mape"])
        tests.append(errors(predict_ensemble(ckpts, test), test.time))
    return vals, tests


def _epoch_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("type") == "epoch"]


def plot_curves(curves: dict[str, list[list[dict]]], const_speed_val_mape: float, png: str) -> None:
    """Validation MAPE (%) per epoch of each variant: the median over its seeds, their min–max shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, runs in curves.items():
        n = max(len(r) for r in runs)
        v = np.full((len(runs), n), np.nan)
        for i, r in enumerate(runs):
            v[i, :len(r)] = [100 * e["val_mape"] for e in r]
        ep = np.arange(1, n + 1)
        line, = ax.plot(ep, np.nanmedian(v, 0), "o-", ms=3, label=name)
        ax.fill_between(ep, np.nanmin(v, 0), np.nanmax(v, 0), color=line.get_color(), alpha=0.12)
    ax.axhline(100 * const_speed_val_mape, color="k", ls="--", label="constant speed")
    ax.set(xlabel="epoch", ylabel="validation MAPE (%)", title="validation MAPE per epoch (median, min–max over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--variant", action="append", required=True, help='NAME="stfast train flags"')
    ap.add_argument("--out", default="runs/accuracy")
    ap.add_argument("--common", default="", help="flags for every run (e.g. --threads 1; the paper's early stopping: "
                                                 "--preset paper --epochs 40 --patience 10)")
    ap.add_argument("--split-days", default=None)
    ap.add_argument("--reuse", action="store_true", help="keep finished runs (OUT/NAME/seedS/summary.json)")
    ap.add_argument("--ensemble", type=int, default=0, help="also score seed ensembles of this size")
    ap.add_argument("--plot", default=None, help="PNG of the validation learning curves (median over seeds)")
    ap.add_argument("--precision", nargs="+", default=None, choices=("32", "64", "bf16-mixed"),
                    help="run every variant in each of these precisions (--precision of stfast train)")
    a = ap.parse_args(argv)
    rows, base, curves, medians = [], None, {}, {}
    specs = [s.split("=", 1) for s in a.variant]
    if a.precision:
        specs = [(f"{n}, {p}", f"{f} --precision {p}".strip()) for n, f in specs for p in a.precision]
    for name, flags in specs:
        res, dirs = [], []
        for seed in a.seeds:
            out = Path(a.out) / name / f"seed{seed}"
            args = ["train", "--seed", str(seed), "--out", str(out), "--no-progress", *shlex.split(a.common),
                    *shlex.split(flags)]
            if a.data:
                args += ["--data", a.data]
            if a.split_days:
                args += ["--split-days", a.split_days]
            if not (a.reuse and (out / "summary.json").is_file()) and stfast_main(args) != 0:
                raise SystemExit(f"run failed: stfast {' '.join(args)}")
            res.append(json.loads((out / "summary.json").read_text()))
            dirs.append(out)
        base = res[0]
        curves[name] = [_epoch_rows(d / "metrics.jsonl") for d in dirs]
        rows.append(_row(name, flags, [r["best_val_mape"] for r in res],
                         [{m: r[f"test_{m}"] for m in ("mape", "mae", "rmse")} for r in res],
                         [r["baseline_const_speed_mape"] for r in res]))
        medians[name] = statistics.median(r["test_mape"] for r in res)
        if a.ensemble > 1 and len(dirs) >= a.ensemble:
            v, t = _ensembles(dirs, a.ensemble, a)
            rows.append(_row(f"{name}, {len(t)} ensembles of {a.ensemble} seeds", flags, v, t))
    lines = ["| model | flags | val MAPE | test MAPE | test MAE | test RMSE | beat constant speed |",
             "|---|---|---|---|---|---|---|", *rows]
    lines.append(f"| constant speed | fitted on the first seed's training split | | {100 * base['baseline_const_speed_mape']:.1f} % | "
                 f"{base['baseline_const_speed_mae']:.1f} s | {base['baseline_const_speed_rmse']:.1f} s | |")
    lines.append(f"| mean travel time | fitted on the first seed's training split | | {100 * base['baseline_mean_time_mape']:.1f} % | "
                 f"{base['baseline_mean_time_mae']:.1f} s | {base['baseline_mean_time_rmse']:.1f} s | |")
    if a.precision and len(a.precision) > 1:  # each variant's median test MAPE against its first precision's
        lines.append("")
        for n, _ in (s.split("=", 1) for s in a.variant):
            first = medians[f"{n}, {a.precision[0]}"]
            lines += [f"{n}: median test MAPE {p} − {a.precision[0]}: {100 * (medians[f'{n}, {p}'] - first):+.2f} points"
                      for p in a.precision[1:]]
    table = "\n".join(lines)
    if a.plot:
        plot_curves(curves, base["baseline_const_speed_val_mape"], a.plot)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
