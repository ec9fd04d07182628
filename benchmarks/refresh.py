"""What a fresh model is worth (issue 63 item 4): a daily refresh cycle on dated trips, three policies side by side.

Train on the first days; then, for each next day, (a) **stale**: keep that first model, (b) **fine-tune**: yesterday's
model trained on the new day's trips (``TrainConfig(init_from=...)``, stfast.train.warm_start), (c) **retrain**: a
model from scratch on every day so far. Each is scored on the following day (MAPE / MAE / RMSE of its trips), and
each policy's training wall time is kept.

    python benchmarks/refresh.py --data ../shared/data/chengdu_deeptte_sample/test --out runs/refresh \
        --doc docs/refresh

The Chengdu sample holds days 24-30; its last day (30) is the held-out test day of every other figure, so the cycle
stops at ``--last-day 29`` (never tuned, nor scored, on day 30). Writes OUT/refresh.json (the rows) and, with
``--doc D``, D.md (the table, the command, the CPU) and D.png (MAPE per scored day and policy).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

POLICIES = ("stale", "fine-tune", "retrain")


def day_files(data: str, out: Path, last_day: int) -> dict[int, Path]:
    """{date id: a DeepTTE JSON-lines file of that day's trips} for the days of ``data`` up to ``last_day``."""
    from stfast.data.load import load_trips

    trips = load_trips(data)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for d in sorted(int(x) for x in np.unique(trips.date_id) if x <= last_day):
        files[d] = out / f"day{d}.jsonl"
        trips.subset(np.flatnonzero(trips.date_id == d)).to_jsonl(files[d])
    return files


def joined(files: list[Path], path: Path) -> Path:
    """``files`` (JSON lines) written one after another to ``path``."""
    path.write_text("".join(f.read_text() for f in files))
    return path


def train_run(out: Path, data: Path, epochs: int, seed: int, threads: int, init_from: Path | None = None) -> tuple:
    """(checkpoint.pt, training wall seconds) of one run of ``epochs`` on ``data`` into ``out``."""
    from stfast.train.config import TrainConfig
    from stfast.train.trainer import train

    cfg = TrainConfig(data=str(data), epochs=epochs, out=str(out), seed=seed, threads=threads, progress=False,
                      overwrite=out.exists(),  # a rerun replaces its own runs
                      init_from=None if init_from is None else str(init_from))
    t0 = time.perf_counter()
    train(cfg)
    return out / "checkpoint.pt", time.perf_counter() - t0


def score(checkpoint: Path, day: Path) -> dict:
    """MAPE (fraction), MAE, RMSE (s) of ``checkpoint``'s model on the trips of ``day``."""
    from stfast.train.metrics import errors
    from stfast.train.trained import load_model

    m = load_model(checkpoint)
    trips = m.load_trips(day)
    return errors(m.predict(trips), trips.time)


def cycle(files: dict[int, Path], out: Path, first_days: int, epochs: int, ft_epochs: int, seed: int,
          threads: int) -> list[dict]:
    """The rows of the cycle (module doc): one per new day and policy."""
    days = sorted(files)
    if len(days) < first_days + 2:
        raise ValueError(f"the cycle needs {first_days} first days, a new day and a day to score: got days {days}")
    first, first_s = train_run(out / "first", joined([files[d] for d in days[:first_days]], out / "first.jsonl"),
                               epochs, seed, threads)
    rows, tuned = [], first
    for i in range(first_days, len(days) - 1):
        new, scored = days[i], days[i + 1]
        tuned, ft_s = train_run(out / f"ft{new}", files[new], ft_epochs, seed, threads, init_from=tuned)
        so_far = joined([files[d] for d in days[:i + 1]], out / f"upto{new}.jsonl")
        fresh, rt_s = train_run(out / f"rt{new}", so_far, epochs, seed, threads)
        for policy, ck, wall in (("stale", first, 0.0), ("fine-tune", tuned, ft_s), ("retrain", fresh, rt_s)):
            rows.append({"new_day": new, "scored_day": scored, "policy": policy, "train_wall_s": wall,
                         **score(ck, files[scored])})
    rows.append({"first_model_wall_s": first_s, "first_days": days[:first_days]})
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table: per scored day, each policy's MAPE / MAE and training wall time."""
    lines = ["| new day | scored day | policy | MAPE | MAE s | RMSE s | training wall s |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if "policy" in r:
            lines.append(f"| {r['new_day']} | {r['scored_day']} | {r['policy']} | {100 * r['mape']:.2f} % | "
                         f"{r['mae']:.1f} | {r['rmse']:.1f} | {r['train_wall_s']:.1f} |")
    means = {p: np.mean([r["mape"] for r in rows if r.get("policy") == p]) for p in POLICIES}
    walls = {p: np.sum([r["train_wall_s"] for r in rows if r.get("policy") == p]) for p in POLICIES}
    lines += ["", "Mean MAPE over the scored days: " + ", ".join(f"{p} {100 * v:.2f} %" for p, v in means.items())
              + f"; training wall time of the cycle: fine-tune {walls['fine-tune']:.1f} s, retrain "
              f"{walls['retrain']:.1f} s (the first model: {rows[-1]['first_model_wall_s']:.1f} s). One seed, "
              f"{len([r for r in rows if r.get('policy') == 'stale'])} scored days: a day's trips are few, so a point "
              "or two between policies on one day is within its noise; the mean is the figure to read."]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for p in POLICIES:
        pts = [(r["scored_day"], 100 * r["mape"]) for r in rows if r.get("policy") == p]
        ax.plot(*zip(*pts), marker="o", label=p)
    ax.set_xticks(sorted({r["scored_day"] for r in rows if "policy" in r}))
    ax.set(xlabel="scored day (date id)", ylabel="MAPE (%)", title="a daily refresh: each model on the next day")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_line() -> str:
    """The CPU in words: /proc/cpuinfo's model name and its widest vector / matrix flags (Linux), else the machine."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name or platform.machine()} ({', '.join(have) or 'no AVX2'})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/chengdu_deeptte_sample/test")
    ap.add_argument("--out", default="runs/refresh")
    ap.add_argument("--doc", default=None, help="write DOC.md and DOC.png (e.g. docs/refresh)")
    ap.add_argument("--first-days", type=int, default=2)
    ap.add_argument("--last-day", type=int, default=29, help="the last day used (the sample's test day 30 is not)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs of the first model and of each retrain")
    ap.add_argument("--ft-epochs", type=int, default=3, help="epochs of each fine-tune")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    out = Path(a.out)
    files = day_files(a.data, out / "days", a.last_day)
    rows = cycle(files, out, a.first_days, a.epochs, a.ft_epochs, a.seed, a.threads)
    (out / "refresh.json").write_text(json.dumps(rows, indent=1))
    text = table(rows)
    print(text)
    if a.doc:
        doc = Path(a.doc)
        plot(rows, doc.with_suffix(".png"))
        cpu = cpu_line()
        doc.with_suffix(".md").write_text(
            f"# What a fresh model is worth (issue 63)\n\nMeasured {time.strftime('%Y-%m-%d')} on {cpu}, "
            f"{a.threads} thread(s), with\n\n```bash\npython benchmarks/refresh.py --data {a.data} --out {a.out} "
            f"--first-days {a.first_days} --last-day {a.last_day} --epochs {a.epochs} --ft-epochs {a.ft_epochs} "
            f"--seed {a.seed} --threads {a.threads} --doc {a.doc}\n```\n\n{text}\n\n"
            f"![MAPE per scored day]({doc.with_suffix('.png').name})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
