"""The Python steps of benchmarks/gpu_check.sh (one subcommand each; ``--help`` works without a GPU).

    record OUTDIR --phase P ...     merge one phase's outcome into OUTDIR/gpu_report.json (after every phase)
    env --json F                    torch / CUDA / GPU / tool versions
    probes --json F                 issue 24 rows 1-4 on CUDA: each invalid or degenerate input either
                                    raises ValueError/RuntimeError or returns; what happened, per row
    memcheck-target [--dtype D]     forward + backward of the geo-conv (packed and padded) and LSTM ops on
                                    CUDA at a size whose weight gradients take the two-level reduction (the
                                    program compute-sanitizer memcheck, initcheck and synccheck run; float16
                                    for the memcheck_half phase)
    racecheck-target                forward + backward of the geo-conv op, float32 and float64, same size:
                                    the shared-memory kernels (compute-sanitizer racecheck)
    deeptte --json F                DeepTTE training step, kernels "fused" vs "reference", CUDA events
    streams --json F                DeepTTE step (fused kernels), component streams plan vs the plain step
    summary OUTDIR                  overall status and the headline numbers into gpu_report.json
    pack OUTDIR                     OUTDIR/gpu_check.tar.gz (every file of the run) and OUTDIR/summary.json

Exit status of the GPU subcommands: 0 done; 4 (``_device.NO_GPU``) when CUDA is not available or stfast
was built without it — after every import, so a CPU machine rehearses each command up to its first CUDA
call (tests/test_gpu_check.py). The sanitizer targets first touch the file given by ``--started`` (before
importing anything but the standard library): gpu_check.sh reads a non-zero exit without it as the
sanitizer's refusal to run the program (a skip), and any other non-zero exit as a failure.

Runs from a checkout without an install (after ``setup.py build_ext --inplace``): the repository root is
appended to ``sys.path`` (gpu_check.sh also exports it in PYTHONPATH). Timings: ``_timing.time_side_by_side``
(interleaved rounds, CUDA events around the repetitions, medians). Nothing here imports gymnasium (absent
on the GPU machine).
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
ARCHIVE, SUMMARY = "gpu_check.tar.gz", "summary.json"
sys.path.insert(0, str(HERE))  # _timing, bench_lstm, components
sys.path.append(str(HERE.parent))  # stfast from the checkout when none is installed
from _device import NO_GPU, missing_device  # noqa: E402 (after the path; no torch import here)


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


def _tests_jsonl(path: Path) -> dict | None:
    """Test counts and the first failures from the lines tests/conftest.py streams to
    STFAST_TEST_RESULTS_JSONL (what a pytest killed at its limit leaves behind: it writes no junit)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    worst: dict[str, dict] = {}  # one outcome per test: a failed teardown after a passed call is an error
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill
        if row["test"] not in worst or rank[row["outcome"]] > rank[worst[row["test"]]["outcome"]]:
            worst[row["test"]] = row
    out = {k: sum(r["outcome"] == k for r in worst.values()) for k in ("passed", "skipped")}
    out.update(tests=len(worst), failures=sum(r["outcome"] == "failed" for r in worst.values()),
               errors=sum(r["outcome"] == "error" for r in worst.values()),
               failed_tests=[{"test": r["test"], "message": r["message"]} for r in worst.values()
                             if r["outcome"] in ("failed", "error")][:20])
    return out


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
        if status is None:  # 77 skips only where gpu_check.sh passes it on: the sanitizer's refusal
            status = {0: "ok", 124: "timeout", 137: "timeout", 77: "skipped"}.get(a.rc, "failed")
        if a.rc == NO_GPU and not a.note:
            a.note = "no GPU (exit 4): CUDA is not available or stfast was built without it"
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
                ph.setdefault("tests", {})[Path(junit).stem] = dict(counts, complete=True)
        for jsonl in a.tests_jsonl or []:  # the run's own record of each test, kept where no junit came
            name = Path(jsonl).name.removesuffix(".tests.jsonl")
            counts = _tests_jsonl(Path(jsonl))
            if counts is not None and name not in ph.get("tests", {}):
                ph.setdefault("tests", {})[name] = dict(counts, complete=False)
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
            summary["tests"][name] = {k: c.get(k) for k in ("passed", "failures", "errors", "skipped", "complete")}
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


def cmd_pack(a) -> int:
    """OUTDIR/summary.json (each phase's status, rc, note and test counts, the summary if made) and
    OUTDIR/gpu_check.tar.gz holding every file of OUTDIR: the device tool brings back only a few files.
    Both written to a temporary name and renamed: a kill during the packing leaves the previous pair."""
    import tarfile

    out = Path(a.outdir)
    report = _load(out / REPORT) or {}
    small = {"dry_run": report.get("dry_run"), "elapsed_s": report.get("elapsed_s"), "archive": ARCHIVE,
             "phases": {n: {k: p.get(k) for k in ("status", "rc", "seconds", "budget_s", "note")}
                        | {"tests": {t: {k: c.get(k) for k in ("tests", "passed", "failures", "errors", "skipped",
                                                               "complete")}
                                     for t, c in p.get("tests", {}).items()}}
                        for n, p in report.get("phases", {}).items()},
             "summary": {k: v for k, v in (report.get("summary") or {}).items() if k != "headline"} or None}
    tmp = out / (ARCHIVE + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(out.rglob("*")):
            if f.is_file() and f.name not in (ARCHIVE, ARCHIVE + ".tmp") and ".no_gymnasium" not in f.parts:
                tar.add(f, arcname=str(f.relative_to(out)))
    os.replace(tmp, out / ARCHIVE)
    (out / (SUMMARY + ".tmp")).write_text(json.dumps(small, indent=1))
    os.replace(out / (SUMMARY + ".tmp"), out / SUMMARY)
    return 0


# ------------------------------------------------------------------------------------------- GPU side
def _no_gpu(device: str) -> int | None:
    """NO_GPU (printing why) when ``device`` cannot run here, else None: called after the imports."""
    why = missing_device(device)
    if why:
        print(why)
        return NO_GPU
    return None


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
    CPU does: the record has the CPU's outcome beside, and ``same_as_cpu``), row 4 (C = 0 / H = 0 / F = 0)
    returns."""
    import torch

    from stfast.ops import geo_conv_packed, geo_conv_padded

    if (rc := _no_gpu("cuda")) is not None:
        return rc
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
        cpu, cuda = results[name]["cpu"], results[name]["cuda"]
        results[name]["same_as_cpu"] = all(cpu.get(key) == cuda.get(key) for key in ("outcome", "type", "message"))
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
    # = [0] (B = 0) for N = 10 points; saved tensors shaped for B = 0 (N_out = N), values from a forward.
    # Offsets on the host on both devices, as the ops take them (CUDA offsets would only meet the "offsets
    # must be a CPU tensor" check): what runs is the op's check of offsets[B] = N, then the kernels.
    def row3(d):
        n = 10
        w = weights(d)
        x = torch.randn(n, 4, device=d)
        out, hidden = torch.ops.stfast.geo_conv_forward(x, torch.tensor([0, n]), torch.randn(n - (k - 1), device=d),
                                                        *w)
        out = torch.cat([out, out[: k - 1]])  # (N, C + 1): N_out of B = 0
        return torch.ops.stfast.geo_conv_backward(torch.randn_like(out), x, torch.tensor([0]), hidden, out, w[0],
                                                  w[2])[0]

    both("row3_offsets_0_backward", row3)
    print(json.dumps(results, indent=1))
    return 0


# The sanitizer targets' size: 24 trips (one of 3 points, 23 of 40-60), N = 1,077 points and N_out = 1,029
# output rows, i.e. 17 tiles of 64 rows in both weight-gradient reductions of the geo-conv backward (more
# than 2: the two-level reduction; on the H200's 132 SMs min(SM fill, ceil(sqrt(17))) = 5 level-1
# groups). DeepTTE's widths (F 4, H 16, C 32, k 3): the projection's partials have P = 80 < 256 columns
# (tile_column_sums' shared row slices), the convolution's P = 1,568 (its whole-column branch).
SANITIZER_LENGTHS = [3] + [40 + (7 * i) % 21 for i in range(23)]


def _started(path: str | None) -> None:
    """Touch ``path`` (gpu_check.sh: the sanitizer did start this program)."""
    if path:
        Path(path).write_text(f"{os.getpid()}\n")


def _geo_conv_fwd_bwd(torch, d: str, dtype) -> dict:
    """Packed and padded (with lengths) geo-conv forward + backward at SANITIZER_LENGTHS; what ran."""
    from stfast.ops import geo_conv_packed, geo_conv_padded

    lengths, k = SANITIZER_LENGTHS, 3
    n, b = sum(lengths), len(lengths)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])  # on the host, as the ops read them
    x = torch.randn(n, 4, device=d, dtype=dtype, requires_grad=True)
    ws = [(torch.randn(*s, device=d, dtype=dtype) * 0.3).requires_grad_() for s in ((16, 4), (16,), (32, 16, k),
                                                                                    (32,))]
    out = geo_conv_packed(x, offsets, torch.randn(n - b * (k - 1), device=d, dtype=dtype), *ws)
    out.square().sum().backward()
    L = max(lengths)
    xp = torch.randn(b, L, 4, device=d, dtype=dtype, requires_grad=True)
    outp = geo_conv_padded(xp, torch.randn(b, L - k + 1, device=d, dtype=dtype), *ws, lengths=torch.tensor(lengths))
    outp.square().sum().backward()
    n_out = n - b * (k - 1)
    return {"dtype": str(dtype), "trips": b, "points": n, "output_rows": n_out, "row_tiles": -(-n_out // 64),
            "point_tiles": -(-n // 64), "grad_sum": float(x.grad.abs().sum() + xp.grad.abs().sum())}


def cmd_memcheck_target(a) -> int:
    """compute-sanitizer memcheck's program (gpu_check.sh runs it with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so
    that every tensor is an allocation of its own and a read past one is caught)."""
    _started(a.started)
    import torch

    from stfast.ops import lstm_packed

    if (rc := _no_gpu(a.device)) is not None:
        return rc
    torch.manual_seed(0)
    d, dtype = a.device, getattr(torch, a.dtype)
    ran = [_geo_conv_fwd_bwd(torch, d, dtype)]
    lengths = SANITIZER_LENGTHS
    n = sum(lengths)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    h, inp = 8, 6
    lw = [(torch.randn(*s, device=d, dtype=dtype) * 0.3).requires_grad_()
          for s in ((4 * h, inp), (4 * h, h), (4 * h,), (4 * h,))]
    xi = torch.randn(n, inp, device=d, dtype=dtype, requires_grad=True)
    y, h_n, c_n = lstm_packed(xi, offsets, lw, 1)
    (y.float().square().sum() + h_n.float().sum() + c_n.float().sum()).backward()
    if d == "cuda":
        torch.cuda.synchronize()
    ran.append({"op": "lstm_packed", "dtype": a.dtype, "points": n, "hidden": h,
                "grad_sum": float(xi.grad.abs().sum())})
    print("sanitizer target: geo-conv (packed, padded) and LSTM forward + backward done:", json.dumps(ran))
    return 0


def cmd_racecheck_target(a) -> int:
    """compute-sanitizer racecheck's program: the geo-conv kernels that share memory within a block
    (conv_partials_kernel's first_point, tile_column_sums' slice sums of proj_partials_kernel), both
    accumulation types (float for float32, double for float64)."""
    _started(a.started)
    import torch

    if (rc := _no_gpu(a.device)) is not None:
        return rc
    torch.manual_seed(0)
    ran = [_geo_conv_fwd_bwd(torch, a.device, dt) for dt in (torch.float32, torch.float64)]
    if a.device == "cuda":
        torch.cuda.synchronize()
    print("racecheck target: geo-conv forward + backward done:", json.dumps(ran))
    return 0


def _time(fns: dict, device: str, reps: int, rounds: int) -> dict:
    from _timing import time_side_by_side

    return time_side_by_side(fns, device, reps, rounds)


def _deeptte_step(kernels: str, batch: int, device: str):
    """bench_lstm's DeepTTE training step (forward, loss, backward, Adam; its loss.item() syncs once per
    step, as a training loop that logs does) with model and batch on CUDA."""
    from bench_lstm import _train_setup, _train_step

    model, opt, b = _train_setup(kernels, batch)
    model.to(device)  # in place: the optimizer keeps the same parameters (no state yet)
    b = b.to(device)
    return lambda: _train_step(model, opt, b)


def cmd_deeptte(a) -> int:
    import bench_lstm  # noqa: F401 (every import before the device check)

    if (rc := _no_gpu(a.device)) is not None:
        return rc
    steps = {k: _deeptte_step(k, a.batch, a.device) for k in ("fused", "reference")}
    t = _time(steps, a.device, a.reps, a.rounds)
    res = {"batch": a.batch, "device": a.device, "fused_ms": t["fused"] * 1e3, "reference_ms": t["reference"] * 1e3,
           "fused_samples_s": a.batch / t["fused"], "reference_samples_s": a.batch / t["reference"],
           "speedup": t["reference"] / t["fused"]}
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


def cmd_streams(a) -> int:
    """The model of benchmarks/components.py (DeepTTE's default kernels="fused": stfast's CUDA ops run on
    the plan's side streams)."""
    import torch
    from components import SHAPES, build, plain_step

    from stfast.parallel.components import ComponentExecutor, ComponentPlan

    if (rc := _no_gpu(a.device)) is not None:
        return rc
    model, b, loss_fn, _ = build(SHAPES[a.shape])
    assert model.cfg.kernels == "fused", model.cfg.kernels
    model, b = model.to(a.device), b.to(a.device)
    ex = ComponentExecutor(ComponentPlan.concurrent(model.component_graph(), a.device))

    def streams():
        model.zero_grad(set_to_none=True)
        ex.forward_backward(b, loss_fn)

    t = _time({"plain": lambda: plain_step(model, b, loss_fn), "streams": streams}, a.device, a.reps, a.rounds)
    res = {"shape": a.shape, "kernels": model.cfg.kernels, "plain_ms": t["plain"] * 1e3,
           "streams_ms": t["streams"] * 1e3,
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
    r.add_argument("--tests-jsonl", action="append",
                   help="NAME.tests.jsonl streamed by tests/conftest.py (counts where NAME's junit is missing)")
    r.set_defaults(fn=cmd_record)
    s = sub.add_parser("summary", help="overall status and headline numbers")
    s.add_argument("outdir")
    s.set_defaults(fn=cmd_summary)
    k = sub.add_parser("pack", help=f"OUTDIR/{ARCHIVE} (every file of the run) and OUTDIR/{SUMMARY}")
    k.add_argument("outdir")
    k.set_defaults(fn=cmd_pack)
    e = sub.add_parser("env", help="versions of torch, CUDA, the GPU and the tools")
    e.add_argument("--json", required=True)
    e.set_defaults(fn=cmd_env)
    p = sub.add_parser("probes", help="issue 24 rows 1-4 on CUDA (and the CPU beside)")
    p.add_argument("--json", required=True)
    p.set_defaults(fn=cmd_probes)
    for name, fn, what in (("memcheck-target", cmd_memcheck_target, "geo-conv and LSTM forward + backward"),
                           ("racecheck-target", cmd_racecheck_target, "geo-conv forward + backward, fp32 and fp64")):
        m = sub.add_parser(name, help=f"{what} on CUDA, the two-level reduction's size")
        m.add_argument("--device", default="cuda", help="cuda; cpu to try the program without a GPU")
        m.add_argument("--started", help="touched first thing (gpu_check.sh: the sanitizer started the program)")
        if name == "memcheck-target":  # memcheck_half runs the half-precision kernels
            m.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
        m.set_defaults(fn=fn)
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
