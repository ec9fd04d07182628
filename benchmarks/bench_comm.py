"""Communicator benchmarks, side by side in one run.

CPU (2 Gloo ranks, DeepTTE on synthetic trips, 16 trips per rank): training-step time of GradientSync
(TorchCommunicator; buckets all-reduced from post-accumulate-grad hooks during the backward) vs torch DDP
vs the flat all-reduce after the backward (stfast.parallel.data_parallel.all_reduce_gradients), each
on its own copy of the model, interleaved in rounds; medians and ratios.

GPU (world size 1, FileStore): all_reduce latency and bus bandwidth, 4 KB – 256 MB, of stfast's
NcclCommunicator vs torch.distributed's NCCL process group (skipped without a GPU or the NCCL build).

    python benchmarks/bench_comm.py [--rounds 7] [--steps 5] [--json out.json]      # CPU ratio table
    python benchmarks/bench_comm.py --gpu [--json out.json]                         # NCCL table
    pytest benchmarks/bench_comm.py --benchmark-disable                             # smoke run
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _timing import time_side_by_side

from stfast.parallel import data_parallel as dp
from stfast.parallel.comm import (
    GradientSync,
    NcclCommunicator,
    TorchCommunicator,
    nccl_available,
)

WORLD = 2
MODES = ("sync", "ddp", "flat")
SIZES = [4 << 10 << (2 * i) for i in range(9)]  # 4 KB, 16 KB, ..., 256 MB (bytes)


# ------------------------------------------------------------------------------ CPU: step time
def _step_fn(mode: str, model, opt, batch, n_global: int, n_local: int, sync: GradientSync | None):
    from stfast.models.deeptte import combine_loss, loss_parts

    net = model.module if mode == "ddp" else model

    def step():
        opt.zero_grad(set_to_none=True)
        parts = loss_parts(net, model(batch), batch)
        loss = combine_loss(parts, net.cfg.alpha, n_global, n_local)
        (loss * WORLD if mode == "ddp" else loss).backward()  # DDP averages: undo it (sum semantics)
        if sync is not None:
            sync.finish()
        elif mode == "flat":
            dp.all_reduce_gradients(list(net.parameters()), dp.DistInfo(dist.get_rank(), WORLD, 0))
        opt.step()
    return step


def _cpu_worker(rank: int, store: str, rounds: int, steps: int, out: str):
    from stfast.data.dataset import DriverVocab, NormStats, TripDataset
    from stfast.data.load import load_trips
    from stfast.models.deeptte import DeepTTE, DeepTTEConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    trips = load_trips(None, n_synthetic=400, seed=0)
    vocab = DriverVocab(trips.driver)
    ds = TripDataset(trips, vocab)
    gb = np.arange(32)
    shard = gb[rank::WORLD]
    batch = ds.batch(shard)
    torch.manual_seed(0)
    base = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    k = base.cfg.kernel_size
    n_local = int(np.maximum(ds.lengths[gb] - k + 1, 0).sum())
    fns = {}
    for mode in MODES:
        net = copy.deepcopy(base)
        model = torch.nn.parallel.DistributedDataParallel(net) if mode == "ddp" else net
        sync = GradientSync(net.parameters(), TorchCommunicator()) if mode == "sync" else None
        fns[mode] = _step_fn(mode, model, torch.optim.Adam(net.parameters(), lr=1e-3), batch, len(gb), n_local, sync)
    for fn in fns.values():  # warm-up
        fn()
    times = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            dist.barrier()
            times[mode].append((time.perf_counter() - t0) / steps)
    if rank == 0:
        n_params = sum(p.numel() for p in base.parameters())
        Path(out).write_text(json.dumps({"times": times, "params": n_params}))
    dp.shutdown(wait_for_peers=True)


def cpu_step_times(rounds: int = 7, steps: int = 5) -> dict:
    """Median step time (s) per mode over ``rounds`` interleaved rounds of ``steps`` steps, and ratios."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        mp.spawn(_cpu_worker, args=(os.path.join(d, "store"), rounds, steps, out), nprocs=WORLD, join=True)
        res = json.loads(Path(out).read_text())
    med = {m: statistics.median(v) for m, v in res["times"].items()}
    return {"median_step_s": med, "params": res["params"], "rounds": rounds, "steps_per_round": steps,
            "ddp_over_sync": med["ddp"] / med["sync"], "flat_over_sync": med["flat"] / med["sync"]}


# ------------------------------------------------------------------------- GPU: all_reduce
def nccl_all_reduce_table(sizes=SIZES, rounds: int = 5) -> list[dict]:
    """Per size: median all_reduce time (µs) and bus bandwidth (GB/s; at world size 1 algbw) of ours and
    torch's, interleaved per round, CUDA events around a loop of calls."""
    with tempfile.TemporaryDirectory() as d:
        ours = NcclCommunicator(dist.FileStore(os.path.join(d, "a"), 1), 0, 1, 0, 60.0, key="bench")
        dist.init_process_group("nccl", store=dist.FileStore(os.path.join(d, "b"), 1), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        rows = []
        for size in sizes:
            x = torch.randn(size // 4, device="cuda")
            iters = max(5, min(200, (1 << 30) // size))
            calls = {"stfast": lambda x=x: ours.all_reduce(x, "sum"), "torch": lambda x=x: dist.all_reduce(x)}
            med = time_side_by_side(calls, "cuda", reps=iters, rounds=rounds, warmup=3)
            rows.append({"bytes": size, "stfast_us": med["stfast"] * 1e6, "torch_us": med["torch"] * 1e6,
                         "stfast_GBps": size / med["stfast"] / 1e9, "torch_GBps": size / med["torch"] / 1e9,
                         "torch_over_stfast": med["torch"] / med["stfast"]})
        ours.close()
        dist.destroy_process_group()
    return rows


# ------------------------------------------------------------------------------------ pytest
def test_cpu_gradient_sync_vs_ddp_step(benchmark):
    res = benchmark.pedantic(cpu_step_times, kwargs={"rounds": 1, "steps": 1}, rounds=1, iterations=1)
    assert set(res["median_step_s"]) == set(MODES) and all(t > 0 for t in res["median_step_s"].values())
    benchmark.extra_info.update(res)


@pytest.mark.skipif(not (torch.cuda.is_available() and nccl_available()), reason="needs a GPU and the NCCL build")
def test_cuda_nccl_all_reduce_latency_bandwidth(benchmark):
    rows = benchmark.pedantic(nccl_all_reduce_table, kwargs={"sizes": SIZES[::4], "rounds": 1}, rounds=1,
                              iterations=1)
    assert [r["bytes"] for r in rows] == SIZES[::4] and all(r["stfast_us"] > 0 for r in rows)
    benchmark.extra_info["rows"] = rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="the NCCL all_reduce table instead of the CPU step times")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}")
    if args.gpu:
        if not (torch.cuda.is_available() and nccl_available()):
            print("no GPU or no NCCL build: nothing to measure")
            return 0
        print(f"NCCL {'.'.join(map(str, NcclCommunicator.nccl_version()))}, {torch.cuda.get_device_name()}")
        result = nccl_all_reduce_table(rounds=args.rounds)
        print(f"{'bytes':>10} {'stfast us':>10} {'torch us':>10} {'stfast GB/s':>12} {'torch GB/s':>11} {'torch/ours':>10}")
        for r in result:
            print(f"{r['bytes']:10d} {r['stfast_us']:10.1f} {r['torch_us']:10.1f} {r['stfast_GBps']:12.2f} "
                  f"{r['torch_GBps']:11.2f} {r['torch_over_stfast']:10.2f}")
    else:
        result = cpu_step_times(args.rounds, args.steps)
        med = result["median_step_s"]
        print(f"DeepTTE ({result['params']:,} parameters), 2 Gloo ranks x 16 trips, 1 thread each; "
              f"median of {args.rounds} interleaved rounds x {args.steps} steps")
        for m in MODES:
            print(f"  {m:5} {1e3 * med[m]:8.1f} ms/step")
        print(f"  DDP / GradientSync = {result['ddp_over_sync']:.3f}, flat / GradientSync = {result['flat_over_sync']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
