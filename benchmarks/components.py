"""Component parallelism of DeepTTE on this machine: per-component time fractions (forward, backward),
the Amdahl bounds they imply, and the measured speed-up of every plan that runs here.

    python benchmarks/components.py                 # full table (a few minutes on 2 cores)
    python benchmarks/components.py --quick         # smoke run
    python benchmarks/components.py --json out.json
    python benchmarks/components.py --shapes "chengdu B64 H128" --no-inproc --reps 9   # 2-process rows only

Baseline: the plain ``model(b)`` + ``loss.backward()`` training step (float32), torch intra-op threads
``--threads`` (default 1; every lane and process gets as many, so the concurrent plans may use 2 cores
where the baseline uses 1 — an upper estimate of their benefit). Plans: ``sequential`` (the executor, one thread: its overhead),
``threads`` (attr ∥ geo-conv, entire ∥ local on two lanes), ``pipeline-M`` (attr + geo-conv + LSTM |
estimators as two CPU "devices", one thread each, M micro-batches). Step times are medians of
interleaved repetitions (A/B in one run); speed-up = baseline / plan. GPU rows (streams, two GPUs) need a
GPU: not executed here.

Two processes × 1 thread (Gloo), every row interleaved in one run (order rotated per repetition), each
step timed between barriers on rank 0: ``plain 1 proc`` (rank 0 alone, the other waits), ``dp 2 procs``
(each rank the plain step on half the global batch), ``components M=4`` (attr + geo-conv + LSTM |
estimators) and ``layers M`` (``component_graph(split_lstm_layers=True)``: attr + geo-conv + LSTM layer 0
| layer 1 + estimators; M = 2, 4, 8). Every 2-process row ends with the trainer's all-reduce of all
gradients (``all_reduce_gradients``). Ratios are per repetition (paired), reported as median [min–max].

Amdahl bounds from the sequential profile: ``streams`` = T / (critical path of forward + of backward)
(unlimited concurrent lanes; DeepTTE's longest path is geo-conv → LSTM → the slower head);
``2 stages`` = T / max(stage 0, stage 1) (a perfect pipeline, M → ∞); with S stages and M micro-batches
GPipe's fill/drain gives T / ((M + S − 1) / M · max stage) — for the cut after the LSTM and for the cut
between its layers. The profile comes from the layer-split graph (``lstm`` = ``lstm_l0`` + ``lstm_l1``).
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
from stfast.parallel.data_parallel import DistInfo, all_reduce_gradients, shutdown

# name: (trips B, min points, max points, hidden H) — Chengdu-like taxi trips, long GeoLife-like trips, a big LSTM
SHAPES = {"chengdu B64 H128": (64, 15, 80, 128), "long trips B16 L200-400": (16, 200, 400, 128),
          "large hidden B64 H512": (64, 15, 80, 512), "geolife B16 L200-400 H512": (16, 200, 400, 512)}
STAGE0 = "lstm"  # the cut: attr + geo-conv + LSTM | attention + entire + local
LAYER0 = "lstm_l0"  # the cut of the layer-split graph: attr + geo-conv + LSTM layer 0 | layer 1 + estimators
LAYER_MICRO = (2, 4, 8)  # micro-batches of the layers plan on 2 processes


def build(shape, seed=0):
    b, lo, hi, h = shape
    trips = random_trips(b, seed=seed, min_len=lo, max_len=hi)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(seed)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), hidden_size=h), NormStats.from_trips(trips))
    ds = TripDataset(trips, vocab)
    batch = ds.batch(np.arange(b))
    n_local = int((batch.lengths - 2).sum())

    def loss_fn(out, mb):  # sums over (micro-batch, shard) / the global batch's counts: exact under splits
        return combine_loss(loss_parts(model, out, mb), 0.3, b, n_local)

    return model, batch, loss_fn, ds


def plain_step(model, b, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model(b), b).backward()


def profile(model, b, loss_fn, reps):
    """Median seconds per (F|B, component) of the sequential executor (and of the loss task)."""
    ex = ComponentExecutor(ComponentPlan.sequential(model.component_graph(split_lstm_layers=True)), profile=True)
    per: dict[tuple[str, str], list[float]] = {}
    ex.forward_backward(b, loss_fn)  # warm-up (first calls allocate)
    for _ in range(reps):
        ex.timings.clear()
        model.zero_grad(set_to_none=True)
        ex.forward_backward(b, loss_fn)
        for kind, name, _m, s in ex.timings:
            per.setdefault((kind, name), []).append(s)
    return {k: statistics.median(v) for k, v in per.items()}


def pipeline_bound(total: float, stage_s: list[float], m: int) -> float:
    """GPipe's bound on the speed-up of S stages over M micro-batches: T / ((M + S − 1) / M · max stage)."""
    return total / ((m + len(stage_s) - 1) / m * max(stage_s))


def bounds(model, prof, micro):
    """Amdahl / pipeline bounds from the layer-split profile ``prof`` (seconds per task)."""
    g = model.component_graph(split_lstm_layers=True)
    fwd = {n: prof[("F", n)] for n in g.order}
    bwd = {n: prof[("B", n)] for n in g.order}
    loss = prof[("L", "<loss>")]
    total = sum(fwd.values()) + sum(bwd.values()) + loss
    crit = g.critical_path(fwd)[0] + g.critical_path(bwd)[0] + loss
    stages = {}
    for key, cut in (("components", g.order[g.order.index("lstm_l0") + model.cfg.num_layers - 1]), ("layers", LAYER0)):
        plan = ComponentPlan.split_after(g, cut, ["cpu", "cpu"])
        st = [sum(fwd[n] + bwd[n] for n in plan.stage_components(s)) for s in (0, 1)]
        st[1] += loss
        stages[key] = st
    return {"total_s": total, "streams": total / crit, "2 stages": total / max(stages["components"]),
            **{f"pipeline-{m}": pipeline_bound(total, stages["components"], m) for m in micro},
            "layers 2 stages": total / max(stages["layers"]),
            **{f"layers-{m}": pipeline_bound(total, stages["layers"], m) for m in LAYER_MICRO},
            "stage_s": stages["components"], "layer_stage_s": stages["layers"], "fwd": fwd, "bwd": bwd, "loss": loss}


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


def _procs_worker(rank, shape, reps, store, out):
    """Rank ``rank`` of 2 Gloo processes (1 thread each): every 2-process row and the 1-process baseline,
    interleaved, ``reps`` timed repetitions after one warm-up; rank 0 writes {row: [seconds]}."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model, b, loss_fn, ds = build(shape)
    params, info = list(model.parameters()), DistInfo(rank, 2, 0)
    shard = ds.batch(np.arange(len(b))[rank::2])  # data parallel: equal shards of the same global batch
    comm = TorchCommunicator()
    ex = {"components M=4": ComponentExecutor(ComponentPlan.split_after(model.component_graph(), STAGE0, ["cpu", "cpu"]),
                                              micro_batches=4, comm=comm, place_modules=False)}
    layers = ComponentPlan.split_after(model.component_graph(split_lstm_layers=True), LAYER0, ["cpu", "cpu"])
    ex.update({f"layers M={m}": ComponentExecutor(layers, micro_batches=m, comm=comm, place_modules=False)
               for m in LAYER_MICRO})

    def plain_1proc():
        if rank == 0:
            plain_step(model, b, loss_fn)

    def dp_2procs():
        plain_step(model, shard, loss_fn)
        all_reduce_gradients(params, info)

    def staged(e):
        def step():
            model.zero_grad(set_to_none=True)
            e.forward_backward(b, loss_fn)
            all_reduce_gradients(params, info)  # as the trainer: every rank keeps the whole model
        return step

    rows = {"plain 1 proc": plain_1proc, "dp 2 procs": dp_2procs, **{k: staged(e) for k, e in ex.items()}}
    names = list(rows)
    times = {k: [] for k in names}
    for i in range(reps + 1):
        for k in names[i % len(names):] + names[:i % len(names)]:  # rotated: no row always follows another
            dist.barrier()
            t0 = time.perf_counter()
            rows[k]()
            dist.barrier()
            if i:
                times[k].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    shutdown(wait_for_peers=True)


def procs_times(shape, reps) -> dict:
    """{row: [seconds per repetition]} of the 2-process rows and the 1-process baseline (see the module doc)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "t.json")
        mp.spawn(_procs_worker, args=(shape, reps, os.path.join(d, "store"), out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())


def paired(times: dict, base: str) -> dict:
    """Per row: median step seconds, min–max, and the per-repetition speed-up base / row: median, min–max."""
    out = {}
    for k, v in times.items():
        r = [a / c for a, c in zip(times[base], v)]
        out[k] = {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                  "speedup": statistics.median(r), "speedup_min": min(r), "speedup_max": max(r)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one small shape, 2 repetitions")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads per lane / process (1: on a shared machine 2 OpenMP threads per "
                         "process were 5-10x slower, spinning against other work)")
    ap.add_argument("--shapes", default="chengdu B64 H128,long trips B16 L200-400,large hidden B64 H512",
                    help=f"comma-separated, of: {', '.join(SHAPES)}")
    ap.add_argument("--no-inproc", action="store_true", help="skip the 1-process rows (threads, CPU-device pipeline)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    names = [k.strip() for k in a.shapes.split(",")]
    if not a.quick and any(k not in SHAPES for k in names):
        ap.error(f"--shapes: unknown {[k for k in names if k not in SHAPES]}; known: {list(SHAPES)}")
    shapes = {"chengdu B16 H128": (16, 15, 40, 128)} if a.quick else {k: SHAPES[k] for k in names}
    reps = 2 if a.quick else a.reps
    micro = (2, 4)
    results = {}
    for name, shape in shapes.items():
        torch.set_num_threads(a.threads)
        model, b, loss_fn, _ = build(shape)
        g = model.component_graph()
        prof = profile(model, b, loss_fn, reps)
        bd = bounds(model, prof, micro)
        t = {}
        if not a.no_inproc:
            ex_seq = ComponentExecutor(ComponentPlan.sequential(g))
            ex_thr = ComponentExecutor(ComponentPlan.concurrent(g), threads=True)
            ex_pipe = {m: ComponentExecutor(ComponentPlan.split_after(g, STAGE0, ["cpu", "cpu"]), micro_batches=m,
                                            threads=True) for m in micro}

            def run(ex, model=model, b=b, loss_fn=loss_fn):
                return lambda: (model.zero_grad(set_to_none=True), ex.forward_backward(b, loss_fn))

            fns = {"plain": lambda model=model, b=b, loss_fn=loss_fn: plain_step(model, b, loss_fn),
                   "sequential": run(ex_seq), "threads": run(ex_thr),
                   **{f"pipeline-{m}": run(e) for m, e in ex_pipe.items()}}
            t = measure(fns, reps)
            for e in (ex_thr, *ex_pipe.values()):
                e.close()
        procs = paired(procs_times(shape, reps), "plain 1 proc")
        results[name] = {"times_s": t, "bounds": bd, "two_procs": procs}
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
        print(f"   stages (attr+geo+lstm_l0 | lstm_l1+heads+loss): {100 * bd['layer_stage_s'][0] / tot:.1f} % | "
              f"{100 * bd['layer_stage_s'][1] / tot:.1f} %")
        if t:
            print(f"   {'1 process':<28}{'step ms':>9}{'speed-up':>10}{'Amdahl bound':>14}")
            rows = [("plain model", "plain", None), ("sequential executor", "sequential", 1.0),
                    ("threads (2 lanes)", "threads", bd["streams"])]
            rows += [(f"pipeline 2 CPU stages M={m}", f"pipeline-{m}", bd[f"pipeline-{m}"]) for m in micro]
            for label, key, bound in rows:
                sp = t["plain"] / t[key]
                print(f"   {label:<28}{1e3 * t[key]:9.1f}{sp:10.2f}{'' if bound is None else f'{bound:14.2f}'}")
        p = r["two_procs"]
        if p:
            dp = p["dp 2 procs"]["median_s"]
            print(f"   {'2 procs x 1 thread':<28}{'step ms [min-max]':>22}{'vs 1 proc [min-max]':>21}"
                  f"{'vs dp':>8}{'bound':>8}")
            for k, v in p.items():
                m = k.split("M=")[-1] if "M=" in k else None
                bound = (bd[f"layers-{m}"] if k.startswith("layers") else bd[f"pipeline-{m}"] if m
                         else 2.0 if k.startswith("dp") else None)
                print(f"   {k:<28}{1e3 * v['median_s']:9.1f} [{1e3 * v['min_s']:.0f}-{1e3 * v['max_s']:.0f}]".ljust(53)
                      + f"{v['speedup']:6.2f} [{v['speedup_min']:.2f}-{v['speedup_max']:.2f}]".rjust(21)
                      + f"{dp / v['median_s']:8.2f}{'' if bound is None else f'{bound:8.2f}'}")
        print(f"   {'GPU streams / 2 GPUs':<28}{'not executed (no GPU here)':>33}\n", flush=True)


if __name__ == "__main__":
    main()
