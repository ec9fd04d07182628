"""Leave-one-day-out cross-validation of candidate training flags: model choice that does not rest on one day.

    python benchmarks/day_cv.py --data ../shared/data/chengdu_deeptte_sample/test --days 24-29 \
        --test-days 30 --seeds 0 1 2 --jobs 2 --out runs/day_cv

Every candidate (a name and the ``stfast train`` flags it adds) trains once per fold and seed: fold ``d``
holds out day ``d`` of ``--days`` as the validation day and trains on the other days of ``--days``. The test
days are passed as the run's test split (a run needs one) and never read here: this script chooses, the test
day is scored afterwards, once, on the chosen candidate.

The rule (fixed before any fold ran, docs/real_data.md "Choosing on six days"):

* per fold, a run's score is ``(MAPE / MAPE_cs + MAE / MAE_cs) / 2`` on its held-out day, with constant
  speed (``cs``: Σdist/Σtime of that fold's training days) as the unit, so that a hard day and an easy day
  weigh the same and 1.0 means "no better than physics";
* a candidate's score is the mean over folds of the median over seeds;
* the pick is the lowest score among candidates whose training time (median ``wall_s`` over its runs, all
  folds) is within ``--max-time`` times the reference candidate's (``--time-ref``, default ``paper``);
* with ``--incumbent NAME`` (the second screen's rule), the table shows each candidate's mean paired
  difference to NAME over the folds with its standard error, and the lowest replaces NAME only when it is
  lower by more than one standard error.

Runs are deterministic per seed at ``--threads 1``; ``--jobs`` runs them in parallel processes, so the
wall times are for ranking only (each run sees the same load). A finished run (``summary.json`` present)
is reused. Prints a markdown table and writes it, with every fold's numbers, to ``OUT/day_cv.md`` and
``OUT/day_cv.json``, and the learning curves (the score per epoch) to ``OUT/day_cv_curves.png``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# candidate name → its full flags: each names every option the presets have changed since, so that a name means
# the same run whatever --preset real is today (2026-12-01 night: one width-64 model, 30 epochs)
_M2 = ["--members", "2", "--hidden-size", "64"]
_H64 = ["--members", "1", "--hidden-size", "64"]
CANDIDATES = {
    "paper": ["--preset", "paper"],
    "h64_e12": _H64 + ["--epochs", "12"],
    "h64_e20": _H64 + ["--epochs", "20"],
    "h64_e30": _H64 + ["--epochs", "30"],
    "h64_e40": _H64 + ["--epochs", "40"],
    "m2h48": ["--members", "2", "--hidden-size", "48", "--epochs", "20"],
    "m2h64_e12": _M2 + ["--epochs", "12"],
    "m2h64_e18": _M2 + ["--epochs", "18"],
    "m2h64": _M2 + ["--epochs", "20"],
}


def _run(job: tuple[str, list[str], Path]) -> Path:
    data, args, out = job
    argv = ["train", "--data", data, "--threads", "1", "--no-progress", "--out", str(out), "--overwrite"] + args
    stamp = out.parent / f"{out.name}.argv.json"  # what made the run: a reused run must be the same one
    if (out / "summary.json").exists() and stamp.exists() and json.loads(stamp.read_text()) != argv:
        raise RuntimeError(f"{out} was made by other flags ({stamp}); remove it or choose another --out")
    if not (out / "summary.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(argv))
        with open(out.parent / f"{out.name}.log", "w") as log:  # the run prints its test table: not shown here
            cmd = [sys.executable, "-m", "stfast.cli"] + argv
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        if rc != 0:
            raise RuntimeError(f"run failed (log: {out.parent / out.name}.log): stfast {' '.join(argv)}")
    return out


def _epochs(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "epoch"]


def _last_epoch(run: Path) -> dict:
    return _epochs(run)[-1]


def plot_curves(runs: dict, cs: dict, path: Path) -> None:
    """Validation score per epoch (the rule's per-fold score, mean over folds and seeds), one line per
    candidate: the learning curves behind the table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(dict.fromkeys(k[0] for k in runs))
    colors = plt.cm.tab20(np.linspace(0, 1, 20))  # distinct lines for up to 20 candidates
    for i, c in enumerate(names):
        curves = [[(r["val_mape"] / cs[d]["mape"] + r["val_mae"] / cs[d]["mae"]) / 2 for r in _epochs(run)]
                  for (name, d, _), run in runs.items() if name == c]
        ax.plot(range(1, len(curves[0]) + 1), np.mean(curves, axis=0), label=c, color=colors[i % 20],
                ls="-" if i < 10 else "--")
    ax.axhline(1.0, color="gray", ls="--", lw=0.8, label="constant speed")
    ax.set(xlabel="epoch", ylabel="held-out day score (1 = constant speed)",
           title="leave-one-day-out validation, mean over folds and seeds")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _spec(days: list[int]) -> str:
    return ",".join(str(d) for d in days)


def constant_speed(data: str, train_days: list[int], day: int) -> dict:
    """Constant speed fitted on ``train_days``: its MAPE (fraction) and MAE (s) on ``day``."""
    from stfast.data.load import load_trips
    from stfast.train.metrics import ConstantSpeedBaseline, errors
    trips = load_trips(data)
    tr, va = np.isin(trips.date_id, train_days), trips.date_id == day
    cs = ConstantSpeedBaseline().fit(trips.dist[tr], trips.time[tr])
    return errors(cs.predict(trips.dist[va]), trips.time[va])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--days", required=True, help="the days to cross-validate over, e.g. 24-29")
    ap.add_argument("--test-days", required=True, help="the test days: each run's test split, never read here")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--candidate", action="append", default=[], metavar="NAME=FLAGS",
                    help="one more candidate, e.g. h64_cos=\"--members 1 --epochs 30 --lr-schedule cosine\"")
    ap.add_argument("--candidates", nargs="+", help="the candidates to run (default: all, with every --candidate)")
    ap.add_argument("--time-ref", default="paper")
    ap.add_argument("--max-time", type=float, default=1.95)
    ap.add_argument("--incumbent", help="a candidate to compare every other with: the mean of the per-fold "
                                        "differences and its standard error (paired over folds)")
    ap.add_argument("--extra", default="", help="flags added to every candidate's, e.g. \"--epochs 1\"")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="runs/day_cv")
    a = ap.parse_args(argv)
    known = dict(CANDIDATES)
    for spec in a.candidate:
        name, sep, flags = spec.partition("=")
        if not sep or not name or name in CANDIDATES:
            ap.error(f"--candidate {spec!r}: expected NAME=FLAGS with a new NAME")
        known[name] = flags.split()
    a.candidates = a.candidates or list(known)
    if unknown := [c for c in a.candidates if c not in known]:
        ap.error(f"unknown candidates {unknown}: known are {list(known)}")
    from stfast.data.splits import _parse_days
    days = sorted(_parse_days(a.days))
    folds = {d: [x for x in days if x != d] for d in days}
    jobs, keys = [], []
    for seed in a.seeds:  # seed-major: an interrupted screen has every candidate on the first seeds
        for d, train in folds.items():
            for c in a.candidates:
                split = f"{_spec(train)}/{d}/{a.test_days}"
                flags = known[c] + a.extra.split() + ["--split-days", split, "--seed", str(seed)]
                jobs.append((a.data, flags, Path(a.out) / c / f"day{d}" / f"seed{seed}"))
                keys.append((c, d, seed))
    with ProcessPoolExecutor(a.jobs) as ex:
        runs = dict(zip(keys, ex.map(_run, jobs)))
    cs = {d: constant_speed(a.data, train, d) for d, train in folds.items()}
    fold_rows, table = [], {}
    for c in a.candidates:
        per_fold, walls = {}, []
        for d in days:
            scores = []
            for seed in a.seeds:
                r = _last_epoch(runs[c, d, seed])
                with open(runs[c, d, seed] / "summary.json") as f:  # same split, same constant speed
                    if abs(json.load(f)["baseline_const_speed_val_mape"] - cs[d]["mape"]) > 1e-9:
                        raise RuntimeError(f"{runs[c, d, seed]}: constant speed differs from the run's")
                s = (r["val_mape"] / cs[d]["mape"] + r["val_mae"] / cs[d]["mae"]) / 2
                scores.append(s)
                walls.append(r["wall_s"])
                fold_rows.append({"candidate": c, "day": d, "seed": seed, "val_mape": r["val_mape"],
                                  "val_mae": r["val_mae"], "score": s, "wall_s": r["wall_s"]})
            per_fold[d] = statistics.median(scores)
        table[c] = {"score": statistics.fmean(per_fold.values()), "per_fold": per_fold,
                    "wall_s": statistics.median(walls)}
    ref = table[a.time_ref]["wall_s"] if a.time_ref in table else None
    ok = {c: t for c, t in table.items() if ref is None or t["wall_s"] <= a.max_time * ref}
    pick = min(ok, key=lambda c: ok[c]["score"])
    inc = table.get(a.incumbent)
    for t in table.values() if inc is not None else ():  # paired over folds: the days' difficulty cancels
        diff = [t["per_fold"][d] - inc["per_fold"][d] for d in days]
        t["vs_incumbent"] = statistics.fmean(diff)
        t["vs_incumbent_se"] = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
    if inc is not None and a.incumbent in ok and not table[pick]["vs_incumbent"] < -table[pick]["vs_incumbent_se"]:
        pick = a.incumbent  # the lowest by less than one paired standard error is chance among many candidates
    head = " | ".join(f"day {d}" for d in days)
    paired = f" − {a.incumbent} (se) |" if inc is not None else ""
    lines = [f"| candidate | score (mean of folds) | {head} | wall s | time ÷ {a.time_ref} |{paired}",
             "|---|---|" + "---|" * len(days) + "---|---|" + ("---|" if inc is not None else "")]
    for c, t in sorted(table.items(), key=lambda kv: kv[1]["score"]):
        ratio = f"{t['wall_s'] / ref:.2f}" if ref else "–"
        name = f"**{c}** (pick)" if c == pick else c + ("" if c in ok else " (over time)")
        vs = f" {t['vs_incumbent']:+.4f} ({t['vs_incumbent_se']:.4f}) |" if inc is not None else ""
        lines.append(f"| {name} | {t['score']:.4f} | " + " | ".join(f"{t['per_fold'][d]:.4f}" for d in days)
                     + f" | {t['wall_s']:.1f} | {ratio} |{vs}")
    lines.append("\nconstant speed per held-out day (MAPE %, MAE s): "
                 + ", ".join(f"{d}: {100 * cs[d]['mape']:.2f} / {cs[d]['mae']:.1f}" for d in days))
    print("\n".join(lines))
    Path(a.out, "day_cv.md").write_text("\n".join(lines) + "\n")
    plot_curves(runs, cs, Path(a.out, "day_cv_curves.png"))
    Path(a.out, "day_cv.json").write_text(json.dumps({"pick": pick, "table": table, "runs": fold_rows,
                                                      "constant_speed": cs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
