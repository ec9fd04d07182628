"""Scoring rate against training rate, side by side on the same data, model and precision (issue 53 item 5).

For each ``--threads`` value: ``stfast train --data DATA --max-steps S --threads T`` (a fresh run folder), then
``stfast predict --checkpoint RUN/checkpoint.pt --split test --threads T``. Three rates, trips per second:

- ``train``: the median of the run's measurement windows (metrics.jsonl ``samples_per_s``, the first two windows
  left out as warm-up): training examples per second, sub-trips included where the run adds them;
- ``final_eval``: the run's final evaluation of its test split (summary.json ``test_trips_per_s``, in the
  training process, warm);
- ``predict``: ``stfast predict``'s own "scored N trips in X s" line (the forward passes of a fresh process,
  reading and preprocessing excluded).

    python benchmarks/predict_rate.py --data /tmp/store_1000000 --threads 1 2 --steps 300 --out /tmp/rate
    python benchmarks/predict_rate.py --data ../shared/data/chengdu_deeptte_sample/test --preset paper --epochs 3

Prints one JSON line per thread count and a table with the ratios predict / train and final_eval / train.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

SCORED = re.compile(r"scored (\d+) trips in ([\d.]+) s \((\d+) trips/s")


def _stfast(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "stfast.cli", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"stfast {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def row(data: str, threads: int, out: Path, steps: int | None, epochs: int | None, extra: list[str]) -> dict:
    """Train, then predict the test split, at ``threads`` threads; the three rates (module doc)."""
    run = out / f"run_t{threads}"
    length = ["--max-steps", str(steps)] if steps else []
    length += ["--epochs", str(epochs)] if epochs else []
    _stfast("train", "--data", data, "--threads", str(threads), "--no-progress", "--out", str(run), "--overwrite",
            *length, *extra)
    windows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [w["samples_per_s"] for w in windows if w.get("type") == "window"][2:]
    if not rates:
        raise SystemExit(f"{run}: fewer than 3 measurement windows; give more --steps")
    summary = json.loads((run / "summary.json").read_text())
    p = _stfast("predict", "--checkpoint", str(run / "checkpoint.pt"), "--split", "test", "--threads", str(threads),
                "--out", str(out / f"pred_t{threads}.csv"))
    m = SCORED.search(p.stderr)
    if m is None:
        raise SystemExit(f"stfast predict printed no 'scored' line:\n{p.stderr[-2000:]}")
    train = statistics.median(rates)
    return {"threads": threads, "train_trips_per_s": train, "final_eval_trips_per_s": summary["test_trips_per_s"],
            "predict_trips_per_s": int(m[1]) / float(m[2]) if float(m[2]) > 0 else float(m[3]),
            "n_test": summary["n_test"], "windows": len(rates)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--data", required=True, help="file, folder or trips store")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=None, help="--max-steps of each training run")
    ap.add_argument("--epochs", type=int, default=None, help="--epochs of each training run")
    ap.add_argument("--preset", default=None, help="--preset of the training runs (default: stfast's)")
    ap.add_argument("--out", default="/tmp/stfast-predict-rate")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--preset", a.preset] if a.preset else []
    rows = []
    for t in a.threads:
        rows.append(row(a.data, t, out, a.steps, a.epochs, extra))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'threads':>7} {'train':>9} {'final eval':>11} {'predict':>9} {'eval/train':>11} {'predict/train':>14}")
    for r in rows:
        tr = r["train_trips_per_s"]
        print(f"{r['threads']:>7} {tr:>9.0f} {r['final_eval_trips_per_s']:>11.0f} {r['predict_trips_per_s']:>9.0f} "
              f"{r['final_eval_trips_per_s'] / tr:>10.2f}× {r['predict_trips_per_s'] / tr:>13.2f}×")


if __name__ == "__main__":
    main()
