"""Where the time of `stfast train` goes (issue 44, item 4): each configuration's run under torch.profiler, the
self CPU time of its operators grouped, beside the wall time of the run's training epochs.

    python benchmarks/step_profile.py --data ../shared/data/chengdu_deeptte_sample/test --split-by date \
        --kernels fused reference --precision 32 bf16-mixed --threads 1 2 --epochs 2 --out runs/step_profile

Groups (self time: an operator's time without the operators it calls):

- ``gemm``: matrix products (``aten::mm / addmm / addmm_ / bmm / matmul``, oneDNN's ``mkldnn_*`` matmuls), the
  fused LSTM's included (inside ``stfast::lstm_*``: ATen calls, ``stfast::onednn_matmul`` where the GEMM plan
  chose oneDNN, ``stfast::brgemm`` where it chose oneDNN's micro-kernel, :mod:`stfast.ops.gemm`), and the fused
  LSTM's tile-fused forward steps (``stfast::lstm_fused_step``: each step's recurrent product with its gates);
- ``onednn_rnn``: torch.nn.LSTM's fused oneDNN RNN (``--kernels reference``): its products and gates together;
- ``fused_ops``: stfast's fused operators' own time: the LSTM's gates and the geo-conv. A fused op called with
  grad enabled runs under its autograd kernel (``GeneratedBackwardFor_stfast_<op>_default``), which the profiler
  records inside ``stfast::<op>``: that kernel's self time is the op's own work (its pointwise steps, gathers),
  not Python's; the backward node (``..._defaultBackward``, the Python backward function) is ``other_ops``;
- ``optimizer``: Adam's ``_foreach`` updates and gradient clipping's norms;
- ``other_ops``: every other ATen operator (elementwise, fills, copies, reductions, indexing, embedding);
- ``outside_ops``: the steps' wall time no operator accounts for: Python, autograd's engine, batching (padding
  on the host), the profiler's own cost per operator (which inflates this group and ``other_ops``).

The shares are of the optimizer steps' wall time (``Trainer.train_step``: forward, backward, gradient
synchronization and update; setup, validation and reports are left out). The profiler adds a few microseconds
per operator, so the trips/s here are lower than `preset_timing.py`'s; the shares are what to read. One run per configuration,
in this process, one after another; writes OUT.md and OUT.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path

from _device import cpu_summary

GEMM = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::_mkldnn",
        "aten::mkldnn_matmul", "aten::mkldnn_linear", "stfast::gemm", "stfast::onednn_matmul", "stfast::brgemm",
        "stfast::lstm_fused_step")
GROUPS = ("gemm", "onednn_rnn", "fused_ops", "optimizer", "other_ops", "outside_ops")


def group_of(name: str) -> str:
    """The group of an operator ``name`` (module docstring)."""
    if name.startswith(GEMM) and "rnn" not in name:
        return "gemm"
    if "mkldnn_rnn" in name or name.startswith("aten::lstm"):
        return "onednn_rnn"
    if name.startswith("stfast::") or (name.startswith("GeneratedBackwardFor_stfast_") and name.endswith("_default")):
        return "fused_ops"
    if "_foreach" in name or "adam" in name.lower() or "clip_grad" in name:
        return "optimizer"
    return "other_ops"


STEP = "stfast.train_step"


def profile_run(args: list[str]) -> dict:
    """``stfast train ARGS`` under the profiler, its optimizer steps (``Trainer.train_step``, forward, backward
    and update of each) marked: seconds per group inside the steps, the steps' wall seconds, the run's trips/s."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from stfast.cli import main as stfast_main
    from stfast.train.trainer import Trainer

    real = Trainer.train_step

    def marked(self, *a, **k):
        with torch.profiler.record_function(STEP):
            return real(self, *a, **k)

    Trainer.train_step = marked
    try:
        with tempfile.TemporaryDirectory() as out:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                rc = stfast_main(args + ["--out", out, "--no-progress"])
            if rc != 0:
                raise SystemExit(f"stfast train {' '.join(args)} failed ({rc})")
            with open(Path(out) / "metrics.jsonl") as f:
                epochs = [r for r in map(json.loads, f) if r.get("type") == "epoch"]
    finally:
        Trainer.train_step = real
    secs = dict.fromkeys(GROUPS, 0.0)
    other: dict[str, float] = {}
    wall, steps = 0.0, 0
    for e in prof.events():
        root = e
        while root.cpu_parent is not None:
            root = root.cpu_parent
        if root.name != STEP:
            continue  # outside the optimizer steps (setup, validation, reports)
        if e is root:
            wall += e.cpu_time_total / 1e6
            steps += 1
            secs["outside_ops"] += e.self_cpu_time_total / 1e6  # the step's time in no operator
        else:
            g = group_of(e.name)
            secs[g] += e.self_cpu_time_total / 1e6
            if g == "other_ops":
                other[e.name] = other.get(e.name, 0.0) + e.self_cpu_time_total / 1e6
    top = dict(sorted(other.items(), key=lambda kv: -kv[1])[:12])
    return {"steps": steps, "wall_s": wall, "seconds": secs, "top_other_ops_s": top,
            "trips_per_s": sorted(r["samples_per_s"] for r in epochs)[len(epochs) // 2]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--split-by", default="date")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--kernels", nargs="+", default=["fused", "reference"])
    ap.add_argument("--precision", nargs="+", default=["32"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    a = ap.parse_args(argv)
    rows = []
    for threads, precision, kernels in itertools.product(a.threads, a.precision, a.kernels):
        args = ["train", "--data", a.data, "--split-by", a.split_by, "--preset", a.preset, "--batch-size",
                str(a.batch_size), "--epochs", str(a.epochs), "--threads", str(threads), "--precision", precision,
                "--kernels", kernels, "--seed", "0"]
        r = profile_run(args)
        rows.append({"threads": threads, "precision": precision, "kernels": kernels, **r})
        print(json.dumps(rows[-1]), flush=True)
    head = "| threads | precision | kernels | trips/s (profiled) | steps' wall s | " + " | ".join(
        f"{g} %" for g in GROUPS) + " |"
    lines = [f"Measured on: {cpu_summary()}", "", head, "|" + "---:|" * (5 + len(GROUPS))]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['precision']} | {r['kernels']} | {r['trips_per_s']:.0f} | "
                     f"{r['wall_s']:.1f} | " + " | ".join(f"{100 * r['seconds'][g] / r['wall_s']:.1f}"
                                                          for g in GROUPS) + " |")
    lines += ["", "The largest of ``other_ops`` (% of the steps' wall time):", ""]
    for r in rows:
        lines.append(f"- {r['threads']} thread(s), {r['precision']}, {r['kernels']}: " + ", ".join(
            f"{k.replace('aten::', '')} {100 * v / r['wall_s']:.1f}" for k, v in r["top_other_ops_s"].items()))
    md = "\n".join(lines)
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".md").write_text(md + "\n")
        Path(a.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
