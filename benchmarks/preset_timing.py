"""Training throughput of `stfast train` configurations side by side: presets, kernels, precisions, threads,
torch.compile.

    python benchmarks/preset_timing.py --data ../shared/data/chengdu_deeptte_sample/test \
        --split-days 24-28/29/30 --seeds 0 1 2 --out runs/preset_timing

compares --preset paper and --preset real (the default axes). Issue 44's acceptance, stfast's fused kernels
against stock PyTorch at its best (``--kernels reference``: padded torch.nn.LSTM on oneDNN) in float32 and
bfloat16 mixed precision, at 1 and 2 threads:

    python benchmarks/preset_timing.py --data ../shared/data/chengdu_deeptte_sample/test --split-by date \
        --presets paper --batch-size 64 --epochs 8 --threads 1 2 --kernels fused reference \
        --precision 32 bf16-mixed --seeds 0 --rounds 2 --out runs/issue44

Stock PyTorch at its best includes torch.compile of its model (issue 51): ``--compile off on`` runs each
configuration eager and with `stfast train --compile` (stfast.train.compiled; compiled before the epochs' clocks,
so trips/s excludes the compilation, whose seconds get their own column), e.g. the padded and compiled stock
rows beside the fused kernels:

    python benchmarks/preset_timing.py --data ../shared/data/chengdu_deeptte_sample/test --split-by date \
        --presets paper --batch-size 64 --epochs 8 --threads 1 --kernels fused reference --compile off on \
        --precision 32 --seeds 0 --out runs/issue51_compile

Every configuration is one `stfast train` run per seed and round, in one process; the runs alternate (round 1:
every configuration once, then round 2, ...), so all configurations see the same machine load. Per configuration
it prints the training throughput of each run (the median over its epochs of ``samples_per_s``: trips per second
of the epoch's optimizer steps, validation excluded; metrics.jsonl), their median, and the median training wall
time (the last epoch's ``wall_s``: training plus each epoch's validation, and the compilation with --compile) and
compilation seconds (summary.json's ``compile_s``; "–" when not compiled). Then, for every axis given exactly two
values (presets, kernels, precisions, threads, compile), the throughput ratio first ÷ second at each setting of the
other axes, per round and of the medians (``kernels fused ÷ reference``: > 1 when the fused kernels train faster);
with ``--kernels fused reference`` and ``--compile off on`` also each fused row ÷ the reference at its best (the
faster of its compile settings, by median). Writes the table to OUT/timing.md.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from stfast.cli import main as stfast_main

AXES = ("threads", "presets", "precision", "kernels", "compile")  # the table's order; each run fixes one value of each
FLAGS = {"threads": "--threads", "presets": "--preset", "precision": "--precision", "kernels": "--kernels",
         "compile": "--compile"}
SWITCHES = {"compile"}  # axes of a switch: "on" gives the flag, "off" leaves it out


def _summary(run: Path) -> dict:
    with open(run / "summary.json") as f:
        return json.load(f)


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "epoch"]


def configurations(a) -> list[dict]:
    """Every combination of the axes' values, as {axis: value}, in table order."""
    values = [getattr(a, ax) for ax in AXES]
    return [dict(zip(AXES, combo)) for combo in itertools.product(*values)]


def run_args(a, conf: dict, seed: int, out: Path) -> list[str]:
    """The `stfast train` arguments of configuration ``conf`` with ``seed``, into ``out``."""
    args = ["train", "--data", a.data, "--seed", str(seed), "--no-progress", "--out", str(out), "--overwrite"]
    for ax, v in conf.items():
        if ax in SWITCHES:
            args += [FLAGS[ax]] if v == "on" else []
        else:
            args += [FLAGS[ax], str(v)]
    for flag, v in (("--split-days", a.split_days), ("--split-by", a.split_by), ("--epochs", a.epochs),
                    ("--batch-size", a.batch_size), ("--max-steps", getattr(a, "max_steps", None))):
        if v is not None:
            args += [flag, str(v)]
    return args


def _shown(ax: str, v) -> str:
    if ax == "threads":
        return f"{v} thread{'s' if int(v) > 1 else ''}"
    if ax == "compile":
        return "compiled" if v == "on" else "eager"
    return str(v)


def _name(conf: dict) -> str:
    return ", ".join(_shown(ax, v) for ax, v in conf.items())


def _key(conf: dict) -> tuple:
    return tuple(conf[ax] for ax in AXES)


def ratio_lines(a, tput: dict[tuple, list[float]]) -> list[str]:
    """For each axis with two values: first ÷ second throughput at every setting of the other axes, per run (the
    same round and seed) and of the medians."""
    lines = []
    for ax in AXES:
        vals = getattr(a, ax)
        if len(vals) != 2:
            continue
        lines += ["", f"| {ax} {vals[0]} ÷ {vals[1]} at | per run | of the medians |", "|---|---|---|"]
        others = [o for o in AXES if o != ax]
        for combo in itertools.product(*(getattr(a, o) for o in others)):
            fixed = dict(zip(others, combo))
            x = tput[_key({**fixed, ax: vals[0]})]
            y = tput[_key({**fixed, ax: vals[1]})]
            per = ", ".join(f"{p / q:.2f}×" for p, q in zip(x, y))
            lines.append(f"| {_name(fixed)} | {per} | {statistics.median(x) / statistics.median(y):.2f}× |")
    return lines + best_stock_lines(a, tput)


def best_stock_lines(a, tput: dict[tuple, list[float]]) -> list[str]:
    """With kernels fused and reference and compile off and on: each fused configuration's median throughput ÷
    the reference's at its best (the faster median of its compile settings, named), at the same other axes."""
    if not ({"fused", "reference"} <= set(a.kernels) and set(a.compile) == {"off", "on"}):
        return []
    lines = ["", "| fused ÷ reference at its best, at | reference's best | of the medians |", "|---|---|---|"]
    others = [o for o in AXES if o not in ("kernels", "compile")]
    for combo in itertools.product(*(getattr(a, o) for o in others)):
        fixed = dict(zip(others, combo))
        best = max(a.compile, key=lambda c: statistics.median(tput[_key({**fixed, "kernels": "reference", "compile": c})]))
        stock = statistics.median(tput[_key({**fixed, "kernels": "reference", "compile": best})])
        for c in a.compile:
            fused = statistics.median(tput[_key({**fixed, "kernels": "fused", "compile": c})])
            lines.append(f"| {_name({**fixed, 'compile': c})} | {_shown('compile', best)} | {fused / stock:.2f}× |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split-days", default=None)
    ap.add_argument("--split-by", default=None, choices=("random", "date"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=1, help="runs of every configuration and seed, alternating")
    ap.add_argument("--epochs", type=int, default=None, help="default: each preset's")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--presets", nargs="+", default=["paper", "real"])
    ap.add_argument("--kernels", nargs="+", default=["fused"], choices=("fused", "reference"))
    ap.add_argument("--precision", nargs="+", default=["32"], choices=("32", "64", "bf16-mixed"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--compile", nargs="+", default=["off"], choices=("off", "on"),
                    help="on: `stfast train --compile` (torch.compile of the model's forward)")
    ap.add_argument("--max-steps", type=int, default=None, help="stop each run after this many optimizer steps "
                    "(a smoke test of the benchmark; with it an epoch may not end and the run has no trips/s)")
    ap.add_argument("--out", default="runs/preset_timing")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be ≥ 1")
    confs = configurations(a)
    wall: dict[tuple, list[float]] = {_key(c): [] for c in confs}
    compile_s: dict[tuple, list[float]] = {_key(c): [] for c in confs}
    tput: dict[tuple, list[float]] = {_key(c): [] for c in confs}
    for r in range(a.rounds):
        for seed in a.seeds:
            for c in confs:
                out = Path(a.out).joinpath(*(str(v) for v in c.values()), f"seed{seed}")
                args = run_args(a, c, seed, out)
                if stfast_main(args) != 0:
                    raise SystemExit(f"run failed: stfast {' '.join(args)}")
                rows = _rows(out)
                if not rows:
                    raise SystemExit(f"no epoch ended (--max-steps {a.max_steps} is less than an epoch): stfast "
                                     f"{' '.join(args)}")
                wall[_key(c)].append(rows[-1]["wall_s"])
                tput[_key(c)].append(statistics.median(e["samples_per_s"] for e in rows))
                if "compile_s" in (summary := _summary(out)):
                    compile_s[_key(c)].append(summary["compile_s"])
                print(f"round {r + 1}, seed {seed}, {_name(c)}: {tput[_key(c)][-1]:.0f} trips/s", flush=True)
    lines = ["| configuration | trips/s per run | trips/s (median) | training wall s (median) | compile s (median) |",
             "|---|---|---|---|---|"]
    for c in confs:
        k = _key(c)
        comp = f"{statistics.median(compile_s[k]):.1f}" if compile_s[k] else "–"
        lines.append(f"| {_name(c)} | {' / '.join(f'{t:,.0f}' for t in tput[k])} | {statistics.median(tput[k]):,.0f} | "
                     f"{statistics.median(wall[k]):.1f} | {comp} |")
    lines += ratio_lines(a, tput)
    print("\n".join(lines))
    Path(a.out, "timing.md").write_text("\n".join(lines) + "\n")  # a.out exists: the runs are in it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
