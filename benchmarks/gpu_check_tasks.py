"""The Python steps of benchmarks/gpu_check.sh (one subcommand each; ``--help`` works without a GPU).

    record OUTDIR --phase P ...     merge one phase's outcome into OUTDIR/gpu_report.json (after every phase)
    env --json F                    torch / CUDA / GPU / tool versions
    probes --json F                 issue 24 rows 1-4 on CUDA: each invalid or degenerate input either
                                    raises ValueError/RuntimeError or returns; what happened, per row
    memcheck-target                 a tiny forward + backward of the geo-conv and LSTM ops on CUDA (the
                                    program compute-sanitizer memcheck runs)
    deeptte --json F                DeepTTE training step, kernels "fused" vs "reference", CUDA events
    streams --json F                DeepTTE step, component streams plan vs the plain step, CUDA events
    summary OUTDIR                  overall status and the headline numbers into gpu_report.json

Timings: ``_timing.time_side_by_side`` (interleaved rounds, CUDA events around the repetitions, medians).
Nothing here imports gymnasium (absent on the GPU machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORT = "gpu_report.json"


# ------------------------------------------------------------------------------------------- report
def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_report(out: Path, report: dict) -> None:
    tmp = out / (REPORT + ".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out / REPORT)  # a reader (or a kill) never sees half a file


def _junit(path: Path) -> dict | None:
    """Test counts and the first failures of a pytest --junitxml file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            failed.append({"test": f"{case.get('classname')}::{case.get('name')}",
                           "message": (bad.get("message") or "")[:300]})
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = failed[:20]
    return counts


def cmd_record(a) -> int:
    out = Path(a.outdir)
    report = _load(out / REPORT) or {}
    if a.plan:  # "name:budget,name:budget,..." — the phases, all pending
        report.update(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), dry_run=a.dry_run, total_budget_s=a.total_budget,
                      phases={}, results={})
        for item in a.plan.split(","):
            name, budget = item.split(":")
            report["phases"][name] = {"status": "pending", "budget_s": int(budget)}
        report["budget_sum_s"] = sum(p["budget_s"] for p in report["phases"].values())
    if a.phase:
        ph = report.setdefault("phases", {}).setdefault(a.phase, {})
        status = a.status
        if status is None:
            status = {0: "ok", 124: "timeout", 137: "timeout", 77: "skipped"}.get(a.rc, "failed")
        ph.update(status=status, rc=a.rc, seconds=a.seconds, log=a.log)
        if a.budget is not None:
            ph["budget_s"] = a.budget
        if a.note:
            ph["note"] = a.note
        if a.command:
            ph["command"] = a.command
        for junit in a.junit or []:
            counts = _junit(Path(junit))
            if counts is not None:
                ph.setdefault("tests", {})[Path(junit).stem] = counts
        for res in a.result or []:
            data = _load(Path(res))
            if data is not None:
                report.setdefault("results", {})[Path(res).stem] = data
    report["elapsed_s"] = a.elapsed if a.elapsed is not None else report.get("elapsed_s")
    _write_report(out, report)
    return 0


def cmd_summary(a) -> int:
    out = Path(a.outdir)
    report = _load(out / REPORT) or {}
    phases = report.get("phases", {})
    res = report.get("results", {})
    summary = {"ok": [n for n, p in phases.items() if p.get("status") == "ok"],
               "failed": [n for n, p in phases.items() if p.get("status") in ("failed", "timeout")],
               "skipped": {n: p.get("note", "") for n, p in phases.items() if p.get("status") == "skipped"},
               "not_run": [n for n, p in phases.items() if p.get("status") == "pending" and n != "summary"],
               "tests": {}}
    for p in phases.values():
        for name, c in p.get("tests", {}).items():
            summary["tests"][name] = {k: c[k] for k in ("passed", "failures", "errors", "skipped")}
    headline = {}
    for row in res.get("bench_geo_conv") or []:
        headline[f"geo_conv {row['shape']} {row['mode']} B{row['batch']}"] = {
            "fused_ms": round(row["fused_ms"], 4), "x_eager": round(row["speedup_vs_eager"], 2),
            "x_compile": round(row["speedup_vs_compile"], 2)}
    for row in res.get("bench_lstm") or []:
        if "stfast_ms" in row:
            headline[f"lstm {row['shape']} B{row['batch']} {row['mode']} {row['input']}"] = {
                "stfast_ms": round(row["stfast_ms"], 4), "x_cudnn": round(row["speedup"], 2)}
    for key in ("bench_deeptte", "bench_streams"):
        if isinstance(res.get(key), dict):
            headline[key] = res[key]
    summary["headline"] = headline
    summary["all_ok"] = not summary["failed"] and not summary["not_run"] and bool(summary["ok"])
    report["summary"] = summary
    _write_report(out, report)
    print(json.dumps(summary, indent=1))
    return 0


# ------------------------------------------------------------------------------------------- GPU side
def cmd_env(a) -> int:
    import shutil
    import subprocess

    import torch

    def version(cmd):
        if shutil.which(cmd[0]) is None:
            return None
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return (r.stdout or r.stderr).strip().splitlines()[-1:] or None

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(),
            "nvcc": version(["nvcc", "--version"]), "cmake": version(["cmake", "--version"]),
            "ninja": version(["ninja", "--version"]), "compute_sanitizer": version(["compute-sanitizer", "--version"])}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=round(p.total_memory / 2**30, 1))
    Path(a.json).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0


def _outcome(fn, device: str) -> dict:
    """What one call did: returned (with the output's shape) or raised (type and message); CUDA errors
    surface at the synchronize."""
    import torch

    try:
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return {"outcome": "returned", "shape": list(out.shape) if hasattr(out, "shape") else None}
    except (ValueError, RuntimeError, IndexError) as e:
        return {"outcome": "raised", "type": type(e).__name__, "message": str(e).splitlines()[0][:300]}


def cmd_probes(a) -> int:
    """Rows 1-4 of issue 24 on CUDA. Expected after the fix: rows 1-3 raise ValueError/RuntimeError (as the
    CPU does: the record has the CPU's outcome beside), row 4 (C = 0 / H = 0 / F = 0) returns."""
    import torch

    from stfast.ops import geo_conv_packed, geo_conv_padded

    k = 3
    results = {}

    def weights(dev, F=4, H=16, C=32):
        g = torch.Generator().manual_seed(0)
        return [t.to(dev) for t in (torch.randn(H, F, generator=g), torch.randn(H, generator=g),
                                    torch.randn(C, H, k, generator=g), torch.randn(C, generator=g))]

    def save():
        Path(a.json).write_text(json.dumps(results, indent=1))  # after each probe: a crash loses nothing

    def both(name, make):
        results[name] = {dev: _outcome(lambda d=dev: make(d), dev) for dev in ("cpu", "cuda")}
        save()

    # row 1: padded lengths > L or < k, lengths on the GPU
    both("row1_padded_lengths_gt_L", lambda d: geo_conv_padded(torch.randn(3, 10, 4, device=d),
                                                               torch.randn(3, 8, device=d), *weights(d),
                                                               lengths=torch.tensor([10, 11, 5], device=d)))
    both("row1_padded_lengths_lt_k", lambda d: geo_conv_padded(torch.randn(3, 10, 4, device=d),
                                                               torch.randn(3, 8, device=d), *weights(d),
                                                               lengths=torch.tensor([10, 2, 5], device=d)))
    # row 2: packed input, a trip shorter than k
    both("row2_short_trip", lambda d: geo_conv_packed(torch.randn(12, 4, device=d), torch.tensor([0, 2, 12], device=d),
                                                      torch.randn(12 - 2 * (k - 1), device=d), *weights(d)))
    # row 4: degenerate sizes are valid (C = 0, H = 0, F = 0)
    both("row4_C0", lambda d: geo_conv_packed(torch.randn(10, 4, device=d), torch.tensor([0, 10], device=d),
                                              torch.randn(10 - (k - 1), device=d), *weights(d, C=0)))
    both("row4_H0", lambda d: geo_conv_packed(torch.randn(10, 4, device=d), torch.tensor([0, 10], device=d),
                                              torch.randn(10 - (k - 1), device=d), *weights(d, H=0)))
    both("row4_F0", lambda d: geo_conv_packed(torch.randn(10, 0, device=d), torch.tensor([0, 10], device=d),
                                              torch.randn(10 - (k - 1), device=d), *weights(d, F=0)))

    # row 3 last (an out-of-bounds read may leave the CUDA context unusable): the backward op with offsets
    # = [0] (B = 0) for N = 10 points; saved tensors shaped for B = 0 (N_out = N), values from a forward
    def row3(d):
        n = 10
        w = weights(d)
        x = torch.randn(n, 4, device=d)
        out, hidden = torch.ops.stfast.geo_conv_forward(x, torch.tensor([0, n], device=d),
                                                        torch.randn(n - (k - 1), device=d), *w)
        out = torch.cat([out, out[: k - 1]])  # (N, C + 1): N_out of B = 0
        return torch.ops.stfast.geo_conv_backward(torch.randn_like(out), x, torch.tensor([0], device=d), hidden, out,
                                                  w[0], w[2])[0]

    both("row3_offsets_0_backward", row3)
    print(json.dumps(results, indent=1))
    return 0


def cmd_memcheck_target(a) -> int:
    import torch

    from stfast.ops import geo_conv_packed, lstm_packed

    torch.manual_seed(0)
    d = a.device
    lengths = [5, 3, 9, 4]
    n, k = sum(lengths), 3
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    x = torch.randn(n, 4, device=d, requires_grad=True)
    ws = [torch.randn(*s, device=d, requires_grad=True) for s in ((16, 4), (16,), (32, 16, k), (32,))]
    out = geo_conv_packed(x, offsets.to(d), torch.randn(n - len(lengths) * (k - 1), device=d), *ws)
    out.square().sum().backward()
    h, inp = 8, 6
    lw = [(torch.randn(*s, device=d) * 0.3).requires_grad_() for s in ((4 * h, inp), (4 * h, h), (4 * h,), (4 * h,))]
    xi = torch.randn(n, inp, device=d, requires_grad=True)
    y, h_n, c_n = lstm_packed(xi, offsets, lw, 1)
    (y.square().sum() + h_n.sum() + c_n.sum()).backward()
    if d == "cuda":
        torch.cuda.synchronize()
    print("memcheck target: geo-conv and LSTM forward + backward done,",
          f"|dx| {float(x.grad.abs().sum()):.3g}, |dxi| {float(xi.grad.abs().sum()):.3g}")
    return 0


def _time(fns: dict, device: str, reps: int, rounds: int) -> dict:
    sys.path.insert(0, str(HERE))
    from _timing import time_side_by_side

    return time_side_by_side(fns, device, reps, rounds)


def _deeptte_step(kernels: str, batch: int, device: str):
    """bench_lstm's DeepTTE training step (forward, loss, backward, Adam; its loss.item() syncs once per
    step, as a training loop that logs does) with model and batch on CUDA."""
    sys.path.insert(0, str(HERE))
    from bench_lstm import _train_setup, _train_step

    model, opt, b = _train_setup(kernels, batch)
    model.to(device)  # in place: the optimizer keeps the same parameters (no state yet)
    b = b.to(device)
    return lambda: _train_step(model, opt, b)


def cmd_deeptte(a) -> int:
    steps = {k: _deeptte_step(k, a.batch, a.device) for k in ("fused", "reference")}
    t = _time(steps, a.device, a.reps, a.rounds)
    res = {"batch": a.batch, "device": a.device, "fused_ms": t["fused"] * 1e3, "reference_ms": t["reference"] * 1e3,
           "fused_samples_s": a.batch / t["fused"], "reference_samples_s": a.batch / t["reference"],
           "speedup": t["reference"] / t["fused"]}
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


def cmd_streams(a) -> int:
    import torch

    sys.path.insert(0, str(HERE))
    from components import SHAPES, build, plain_step

    from stfast.parallel.components import ComponentExecutor, ComponentPlan

    model, b, loss_fn, _ = build(SHAPES[a.shape])
    model, b = model.to(a.device), b.to(a.device)
    ex = ComponentExecutor(ComponentPlan.concurrent(model.component_graph(), a.device))

    def streams():
        model.zero_grad(set_to_none=True)
        ex.forward_backward(b, loss_fn)

    t = _time({"plain": lambda: plain_step(model, b, loss_fn), "streams": streams}, a.device, a.reps, a.rounds)
    res = {"shape": a.shape, "plain_ms": t["plain"] * 1e3, "streams_ms": t["streams"] * 1e3,
           "speedup": t["plain"] / t["streams"], "device": a.device,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None}
    ex.close()
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="merge one phase's outcome into OUTDIR/gpu_report.json")
    r.add_argument("outdir")
    r.add_argument("--plan", help="name:budget_s,... (starts a new report: every phase pending)")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--total-budget", type=int, default=None)
    r.add_argument("--phase")
    r.add_argument("--rc", type=int, default=None)
    r.add_argument("--status", default=None, help="default: from --rc (0 ok, 124/137 timeout, 77 skipped)")
    r.add_argument("--seconds", type=float, default=None)
    r.add_argument("--budget", type=int, default=None)
    r.add_argument("--elapsed", type=float, default=None)
    r.add_argument("--log")
    r.add_argument("--note")
    r.add_argument("--command", help="dry run: what the phase will run")
    r.add_argument("--junit", action="append", help="pytest --junitxml file (counts and failures)")
    r.add_argument("--result", action="append", help="a phase's JSON output, stored under results[<stem>]")
    r.set_defaults(fn=cmd_record)
    s = sub.add_parser("summary", help="overall status and headline numbers")
    s.add_argument("outdir")
    s.set_defaults(fn=cmd_summary)
    e = sub.add_parser("env", help="versions of torch, CUDA, the GPU and the tools")
    e.add_argument("--json", required=True)
    e.set_defaults(fn=cmd_env)
    p = sub.add_parser("probes", help="issue 24 rows 1-4 on CUDA (and the CPU beside)")
    p.add_argument("--json", required=True)
    p.set_defaults(fn=cmd_probes)
    m = sub.add_parser("memcheck-target", help="tiny forward + backward of both ops on CUDA")
    m.add_argument("--device", default="cuda", help="cuda; cpu to try the program without a GPU")
    m.set_defaults(fn=cmd_memcheck_target)
    d = sub.add_parser("deeptte", help="DeepTTE training step, fused vs reference kernels")
    d.add_argument("--batch", type=int, default=256)
    d.add_argument("--reps", type=int, default=5)
    d.add_argument("--rounds", type=int, default=3)
    d.add_argument("--device", default="cuda", help="cuda; cpu to try it without a GPU")
    d.add_argument("--json", required=True)
    d.set_defaults(fn=cmd_deeptte)
    t = sub.add_parser("streams", help="component streams plan vs the plain step")
    t.add_argument("--shape", default="chengdu B64 H128")
    t.add_argument("--reps", type=int, default=5)
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--device", default="cuda", help="cuda; cpu to try it without a GPU")
    t.add_argument("--json", required=True)
    t.set_defaults(fn=cmd_streams)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
