"""Where the time of `stfast train` goes (issue 44, item 4): each configuration's run under torch.profiler, the
self CPU time of its operators grouped, beside the wall time of the run's training epochs.

    python benchmarks/step_profile.py --data ../shared/data/chengdu_deeptte_sample/test --split-by date \
        --kernels fused reference --precision 32 bf16-mixed --threads 1 2 --epochs 2 --out runs/step_profile

Groups (self time: an operator's time without the operators it calls):

- ``gemm``: matrix products (``aten::mm / addmm / addmm_ / bmm / matmul``, oneDNN's ``mkldnn_*`` matmuls), the
  fused LSTM's included (inside ``stfast::lstm_*``: ATen calls, ``stfast::onednn_matmul`` where the GEMM plan
  chose oneDNN, ``stfast::brgemm`` where it chose oneDNN's micro-kernel, :mod:`stfast.ops.gemm`), and the fused
  LSTM's tile-fused steps (``stfast::lstm_fused_step``: each forward step's recurrent product with its gates;
  ``stfast::lstm_fused_backward_step``: each backward step's gate gradients with their product dG·W_hh);
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

FLOP rates (issue 51, item 5). The run's first optimizer step is counted, not profiled: it runs under
``torch.utils.flop_counter.FlopCounterMode`` with stfast's formulas (:mod:`stfast.ops.flops`: the fused LSTM over
its alive positions, the geo-conv, and torch.nn.LSTM's oneDNN layer over every padded position) and outside the
marked steps, so its counting costs no profiled time (the first step also carries the one-time costs: GEMM
probe, workspaces; the run's trips/s, read from its epochs, still include that step). Its FLOPs per LSTM position (alive ones for ``fused``, padded ones ``B × longest`` for
``reference``: what each LSTM computes, >90 % of the FLOPs) times the profiled steps' LSTM positions give their
FLOPs: batches are sorted by length inside chunks, so one batch's FLOPs would not stand for the others'. Rates:

- step GFLOP/s: those FLOPs / the steps' wall time;
- per group, its FLOPs / its self time: ``gemm`` holds the fused LSTM's products (``stfast::lstm_*``, counted
  whole: only products count) and the model's ``mm`` / ``addmm``; ``onednn_rnn`` the reference's LSTM (oneDNN's
  RNN runs products and gates in one operator); ``fused_ops`` the geo-conv (with every fused op's pointwise time).

Beside them, in the same run after the profile, each GEMM library's own rate at the fused LSTM's shapes
(:func:`stfast.ops.gemm_rates`, H 128, for every (operand, output) dtype pair the precision uses, ``bulk`` and
``step``; ``brgemm`` is oneDNN's micro-kernel) and the library the run chose: what the step's products could
reach on this CPU.
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
        "stfast::lstm_fused_step", "stfast::lstm_fused_backward_step")
GROUPS = ("gemm", "onednn_rnn", "fused_ops", "optimizer", "other_ops", "outside_ops")
RATE_GROUPS = ("gemm", "onednn_rnn")  # the groups that run the step's products, whose GFLOP/s OUT.md shows


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


def flop_group(op: str) -> str:
    """The group whose self time runs the products that FlopCounterMode counts for ``op`` (``"ns.name"``, as
    torch names an op packet): the fused LSTM's products run in ``gemm`` (ATen, oneDNN or micro-kernel calls
    inside it, and its tile-fused steps), every other op's in its own group (:func:`group_of`)."""
    name = op.replace(".", "::", 1)
    return "gemm" if name.startswith("stfast::lstm_") else group_of(name)


def lstm_positions(trainer, gb) -> int:
    """Positions the step on ``gb`` (trip indices, or a list of micro-batches) runs its LSTM over: each trip's
    L − k + 1 for the fused LSTM, B × the longest per micro-batch for torch.nn.LSTM on the padded batch."""
    import numpy as np

    lengths, cfg = trainer.data.train_ds.lengths, trainer.model.cfg
    micro = [gb] if isinstance(gb, np.ndarray) else list(gb)
    windows = [lengths[m] - (cfg.kernel_size - 1) for m in micro if len(m)]
    if cfg.kernels == "fused":
        return sum(int(w.sum()) for w in windows)
    return sum(len(w) * int(w.max()) for w in windows)


def library_rates(precision: str, threads: int) -> dict[str, dict[str, dict]]:
    """{pair: {use: {"rates": {library: GFLOP/s}, "chosen": library}}} for every (operand, output) dtype pair
    the fused kernels use in ``precision`` (stfast.train.gemm_plan.PAIRS), at ``threads`` intra-op threads,
    measured now (:func:`stfast.ops.gemm_rates`); the choice is the one in force (the run's plan)."""
    import torch

    from stfast.ops import gemm
    from stfast.train.gemm_plan import PAIRS

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return {"->".join(str(d).replace("torch.", "") for d in pair): {
            use: {"rates": {lib: r for lib, r in gemm.gemm_rates(*pair, use=use).items() if r > 0},
                  "chosen": gemm.gemm_library(*pair, use=use)} for use in gemm.USES} for pair in PAIRS[precision]}
    finally:
        torch.set_num_threads(before)


def profile_run(args: list[str]) -> dict:
    """``stfast train ARGS`` under the profiler, its optimizer steps (``Trainer.train_step``, forward, backward
    and update of each) marked: seconds per group inside the steps, the steps' wall seconds, the run's trips/s;
    the first step's FLOPs per group (counted, not marked: module docstring), the FLOPs of the marked steps
    estimated from them, GFLOP/s of the steps and of each group that has FLOPs."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    import stfast.ops.flops  # noqa: F401  (registers stfast's FLOP formulas)
    from stfast.cli import main as stfast_main
    from stfast.train.trainer import Trainer

    real = Trainer.train_step
    counted: dict = {}  # the first step's FLOPs per group, LSTM positions; the run's precision, threads, H
    positions: list[int] = []  # LSTM positions of each marked step

    def marked(self, gb, *a, **k):
        if not counted:
            with FlopCounterMode(display=False) as fc:
                r = real(self, gb, *a, **k)
            flops = dict.fromkeys(GROUPS, 0)
            for op, n in fc.get_flop_counts()["Global"].items():
                flops[flop_group(str(op))] += n
            counted.update(flops=flops, positions=lstm_positions(self, gb), threads=torch.get_num_threads(),
                           precision=self.cfg.precision, hidden_size=self.model.cfg.hidden_size)
            return r
        positions.append(lstm_positions(self, gb))
        with torch.profiler.record_function(STEP):
            return real(self, gb, *a, **k)

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
            continue  # outside the optimizer steps (setup, the counted step, validation, reports)
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
    scale = sum(positions) / counted["positions"]  # the marked steps' LSTM positions over the counted step's
    flops = {g: n * scale for g, n in counted["flops"].items()}
    return {"steps": steps, "wall_s": wall, "seconds": secs, "top_other_ops_s": top,
            "trips_per_s": sorted(r["samples_per_s"] for r in epochs)[len(epochs) // 2],
            "counted_step": counted, "flops": flops, "step_gflop": sum(flops.values()) / max(steps, 1) / 1e9,
            "step_gflops": sum(flops.values()) / wall / 1e9 if wall > 0 else 0.0,
            "group_gflops": {g: flops[g] / secs[g] / 1e9 for g in GROUPS if flops[g] and secs[g] > 0},
            "library_gflops": library_rates(counted["precision"], counted["threads"])}


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
        f"{g} %" for g in GROUPS) + " | step GFLOP | step GFLOP/s | " + " | ".join(
        f"{g} GFLOP/s" for g in RATE_GROUPS) + " |"
    lines = [f"Measured on: {cpu_summary()}", "", head, "|" + "---:|" * (7 + len(GROUPS) + len(RATE_GROUPS))]
    for r in rows:
        rates = r["group_gflops"]
        lines.append(f"| {r['threads']} | {r['precision']} | {r['kernels']} | {r['trips_per_s']:.0f} | "
                     f"{r['wall_s']:.1f} | " + " | ".join(f"{100 * r['seconds'][g] / r['wall_s']:.1f}"
                                                          for g in GROUPS)
                     + f" | {r['step_gflop']:.2f} | {r['step_gflops']:.1f} | "
                     + " | ".join(f"{rates[g]:.1f}" if g in rates else "–" for g in RATE_GROUPS) + " |")
    lines += ["", "step GFLOP: the profiled steps' mean FLOPs (FlopCounterMode with stfast.ops.flops on the run's "
              "first, unprofiled step, scaled by the steps' LSTM positions); step GFLOP/s: their FLOPs / their wall "
              "time; a group's GFLOP/s: its FLOPs / its self time (gemm: the fused LSTM's and the layers' products; "
              "onednn_rnn: torch.nn.LSTM's)."]
    lines += ["", "Each GEMM library's own rate at the fused LSTM's shapes (stfast.ops.gemm_rates, H 128; GFLOP/s, "
              "measured after each run at its thread count; * the run's choice; brgemm: oneDNN's micro-kernel):", ""]
    for r in rows:
        h = r["counted_step"]["hidden_size"]
        lines.append(f"- {r['threads']} thread(s), {r['precision']}, {r['kernels']}"
                     + (f" (this model's H is {h})" if h != 128 else "") + ": " + "; ".join(
            f"{pair} {use}: " + ", ".join(f"{lib}{'*' if lib == u['chosen'] else ''} {v:.0f}"
                                          for lib, v in u["rates"].items())
            for pair, uses in r["library_gflops"].items() for use, u in uses.items()))
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
