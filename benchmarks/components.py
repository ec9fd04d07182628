"""Component parallelism of DeepTTE on this machine: per-component time fractions (forward, backward),
the Amdahl bounds they imply, and the measured speed-up of every plan that runs here.

    python benchmarks/components.py                 # full table (a few minutes on 2 cores)
    python benchmarks/components.py --quick         # smoke run
    python benchmarks/components.py --json out.json

Baseline: the plain ``model(b)`` + ``loss.backward()`` training step (float32), torch intra-op threads
``--threads`` (default 1; every lane and process gets as many, so the concurrent plans may use 2 cores
where the baseline uses 1 — an upper estimate of their benefit). Plans: ``sequential`` (the executor, one thread: its overhead),
``threads`` (attr ∥ geo-conv, entire ∥ local on two lanes), ``pipeline-M`` (attr + geo-conv + LSTM |
estimators as two CPU "devices", one thread each, M micro-batches), ``gloo-2proc`` (the same two stages
in 2 Gloo processes with send/recv, one core each). Step times are medians of interleaved repetitions
(A/B in one run); speed-up = baseline / plan. GPU rows (streams, two GPUs) need a GPU: not executed here.

Amdahl bounds from the sequential profile: ``streams`` = T / (critical path of forward + of backward)
(unlimited concurrent lanes; DeepTTE's longest path is geo-conv → LSTM → the slower head);
``2 stages`` = T / max(stage 0, stage 1) (a perfect pipeline, M → ∞); with M micro-batches GPipe's
fill/drain gives T / ((M + 1) / M · max stage).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import random_trips

from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from stfast.parallel.comm import TorchCommunicator
from stfast.parallel.components import ComponentExecutor, ComponentPlan

# name: (trips B, min points, max points, hidden H) — Chengdu-like taxi trips, long GeoLife-like trips, a big LSTM
SHAPES = {"chengdu B64 H128": (64, 15, 80, 128), "long trips B16 L200-400": (16, 200, 400, 128),
          "large hidden B64 H512": (64, 15, 80, 512)}
STAGE0 = "lstm"  # the cut: attr + geo-conv + LSTM | attention + entire + local


def build(shape, seed=0):
    b, lo, hi, h = shape
    trips = random_trips(b, seed=seed, min_len=lo, max_len=hi)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(seed)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), hidden_size=h), NormStats.from_trips(trips))
    batch = TripDataset(trips, vocab).batch(np.arange(b))
    n_local = int((batch.lengths - 2).sum())

    def loss_fn(out, mb):
        return combine_loss(loss_parts(model, out, mb), 0.3, b, n_local)

    return model, batch, loss_fn


def plain_step(model, b, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model(b), b).backward()


def profile(model, b, loss_fn, reps):
    """Median seconds per (F|B, component) of the sequential executor (and of the loss task)."""
    ex = ComponentExecutor(ComponentPlan.sequential(model.component_graph()), profile=True)
    per: dict[tuple[str, str], list[float]] = {}
    ex.forward_backward(b, loss_fn)  # warm-up (first calls allocate)
    for _ in range(reps):
        ex.timings.clear()
        model.zero_grad(set_to_none=True)
        ex.forward_backward(b, loss_fn)
        for kind, name, _m, s in ex.timings:
            per.setdefault((kind, name), []).append(s)
    return {k: statistics.median(v) for k, v in per.items()}


def bounds(model, prof, micro):
    g = model.component_graph()
    fwd = {n: prof[("F", n)] for n in g.order}
    bwd = {n: prof[("B", n)] for n in g.order}
    loss = prof[("L", "<loss>")]
    total = sum(fwd.values()) + sum(bwd.values()) + loss
    crit = g.critical_path(fwd)[0] + g.critical_path(bwd)[0] + loss
    plan = ComponentPlan.split_after(g, STAGE0, ["cpu", "cpu"])
    st = [sum(fwd[n] + bwd[n] for n in plan.stage_components(s)) for s in (0, 1)]
    st[1] += loss
    return {"total_s": total, "streams": total / crit, "2 stages": total / max(st),
            **{f"pipeline-{m}": total / ((m + 1) / m * max(st)) for m in micro},
            "stage_s": st, "fwd": fwd, "bwd": bwd, "loss": loss}


def measure(fns: dict, reps: int) -> dict:
    """Median seconds of each fn, interleaved (A, B, C, A, B, C, ...) after one warm-up each."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _gloo_worker(rank, shape, reps, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model, b, loss_fn = build(shape)
    ex = ComponentExecutor(ComponentPlan.split_after(model.component_graph(), STAGE0, ["cpu", "cpu"]),
                           micro_batches=4, comm=TorchCommunicator(), place_modules=False)
    times = []
    for i in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        ex.forward_backward(b, loss_fn)
        dist.barrier()
        if i:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(statistics.median(times)))
    dist.destroy_process_group()


def gloo_time(shape, reps) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t.json")
        mp.spawn(_gloo_worker, args=(shape, reps, os.path.join(d, "store"), out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one small shape, 2 repetitions, no Gloo run")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads per lane / process (1: on a shared machine 2 OpenMP threads per "
                         "process were 5-10x slower, spinning against other work)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    shapes = {"chengdu B16 H128": (16, 15, 40, 128)} if a.quick else {k: SHAPES[k] for k in a.shapes.split(",")}
    reps = 2 if a.quick else a.reps
    micro = (2, 4)
    results = {}
    for name, shape in shapes.items():
        torch.set_num_threads(a.threads)
        model, b, loss_fn = build(shape)
        g = model.component_graph()
        prof = profile(model, b, loss_fn, reps)
        bd = bounds(model, prof, micro)
        ex_seq = ComponentExecutor(ComponentPlan.sequential(g))
        ex_thr = ComponentExecutor(ComponentPlan.concurrent(g), threads=True)
        ex_pipe = {m: ComponentExecutor(ComponentPlan.split_after(g, STAGE0, ["cpu", "cpu"]), micro_batches=m,
                                        threads=True) for m in micro}

        def run(ex, model=model, b=b, loss_fn=loss_fn):
            return lambda: (model.zero_grad(set_to_none=True), ex.forward_backward(b, loss_fn))

        fns = {"plain": lambda model=model, b=b, loss_fn=loss_fn: plain_step(model, b, loss_fn), "sequential": run(ex_seq), "threads": run(ex_thr),
               **{f"pipeline-{m}": run(e) for m, e in ex_pipe.items()}}
        t = measure(fns, reps)
        for e in (ex_thr, *ex_pipe.values()):
            e.close()
        if not a.quick:
            t_plain_again = measure({"plain": fns["plain"]}, reps)["plain"]  # around the Gloo run
            t["gloo-2proc"] = gloo_time(shape, reps)
            t["plain"] = statistics.median([t["plain"], t_plain_again])
        results[name] = {"times_s": t, "bounds": bd}
        print_table({name: results[name]}, micro, a)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


def print_table(results, micro, a):
    print(flush=True)
    print(f"DeepTTE component parallelism on CPU ({os.cpu_count()} cores, torch threads {a.threads}, float32; "
          "the machine is shared: ratios measured side by side, medians)\n")
    for name, r in results.items():
        bd, t = r["bounds"], r["times_s"]
        tot = bd["total_s"]
        print(f"== {name}: sequential profile {1e3 * tot:.1f} ms per step")
        print("   component     forward %   backward %")
        for n in bd["fwd"]:
            print(f"   {n:<12}{100 * bd['fwd'][n] / tot:9.1f}{100 * bd['bwd'][n] / tot:12.1f}")
        print(f"   {'loss':<12}{100 * bd['loss'] / tot:9.1f}")
        print(f"   stages (attr+geo+lstm | heads+loss): {100 * bd['stage_s'][0] / tot:.1f} % | "
              f"{100 * bd['stage_s'][1] / tot:.1f} %")
        print(f"   {'plan':<24}{'step ms':>9}{'speed-up':>10}{'Amdahl bound':>14}")
        rows = [("plain model", "plain", None), ("sequential executor", "sequential", 1.0),
                ("threads (2 lanes)", "threads", bd["streams"])]
        rows += [(f"pipeline 2 CPU stages M={m}", f"pipeline-{m}", bd[f"pipeline-{m}"]) for m in micro]
        if "gloo-2proc" in t:
            rows.append(("2 Gloo procs M=4", "gloo-2proc", bd["pipeline-4"]))
        for label, key, bound in rows:
            sp = t["plain"] / t[key]
            print(f"   {label:<24}{1e3 * t[key]:9.1f}{sp:10.2f}{'' if bound is None else f'{bound:14.2f}'}")
        print(f"   {'GPU streams / 2 GPUs':<24}{'not executed (no GPU here)':>33}\n", flush=True)


if __name__ == "__main__":
    main()
