"""Training time and throughput of `stfast train` under --preset paper and --preset real, side by side.

    python benchmarks/preset_timing.py --data ../shared/data/chengdu_deeptte_sample/test \
        --split-days 24-28/29/30 --seeds 0 1 2 --out runs/preset_timing

Runs alternate (paper seed 0, real seed 0, paper seed 1, ...) in one process at 1 thread, so both presets
see the same machine load. Per preset it prints the median training wall time (metrics.jsonl's last epoch
``wall_s``: training plus each epoch's validation), the median over epochs and runs of the training
throughput (``samples_per_s``: trips per second of the epoch's optimizer steps), and the ratios real ÷ paper.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from stfast.cli import main as stfast_main


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "epoch"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split-days", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--presets", nargs="+", default=["paper", "real"])
    ap.add_argument("--out", default="runs/preset_timing")
    a = ap.parse_args(argv)
    wall: dict[str, list[float]] = {p: [] for p in a.presets}
    tput: dict[str, list[float]] = {p: [] for p in a.presets}
    for seed in a.seeds:
        for p in a.presets:
            out = Path(a.out) / p / f"seed{seed}"
            args = ["train", "--data", a.data, "--preset", p, "--seed", str(seed), "--threads", "1", "--no-progress",
                    "--out", str(out), "--overwrite"] + (["--split-days", a.split_days] if a.split_days else [])
            if stfast_main(args) != 0:
                raise SystemExit(f"run failed: stfast {' '.join(args)}")
            rows = _rows(out)
            wall[p].append(rows[-1]["wall_s"])
            tput[p] += [r["samples_per_s"] for r in rows]
    lines = ["| preset | training wall s (median, per run) | trips/s (median over epochs) |", "|---|---|---|"]
    for p in a.presets:
        lines.append(f"| {p} | {statistics.median(wall[p]):.1f} ({', '.join(f'{w:.1f}' for w in wall[p])}) | "
                     f"{statistics.median(tput[p]):.0f} |")
    if len(a.presets) == 2:
        x, y = a.presets
        ratios = [b / c for b, c in zip(wall[y], wall[x])]
        lines.append(f"\n{y} ÷ {x}: training time {statistics.median(wall[y]) / statistics.median(wall[x]):.2f}× "
                     f"(per seed {', '.join(f'{r:.2f}' for r in ratios)}), throughput "
                     f"{statistics.median(tput[y]) / statistics.median(tput[x]):.2f}×")
    print("\n".join(lines))
    Path(a.out, "timing.md").write_text("\n".join(lines) + "\n")  # a.out exists: the runs are in it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
