"""Load balance of the data-parallel slicer (issue 6), in four parts:

1. profile: DeepTTE forward + backward timed on shards of many sizes and lengths (this CPU, one
   thread), and the slicer's cost model t = a + b·n + c·Σlen + d·n·L_max + e·L_max fitted to them.
2. table: predicted imbalance (max / mean shard time; median over random global batches) on the
   length distributions of the Chengdu and GeoLife samples and the synthetic city, W ∈ {2, 4, 8, 16, 64},
   global batch 256 and 1024, for equal-count random (DistributedSampler-like), sorted-strided, LPT on
   Σlen only, and the balanced slicer under the fitted model (all scored under the fitted model).
   Also the issue's anchor (cost Σlen + n·L_max) for equal-count vs balanced.
3. cluster: W up to 1,024 simulated with the fitted model: predicted imbalance and the rank-seconds
   per epoch spent waiting, equal-count vs balanced.
4. live: 2 Gloo ranks (one thread each) on GeoLife lengths, balanced and equal-count steps
   interleaved on the same global batches in one run: measured imbalance and step time; a third arm
   gives both ranks the same shard, whose measured imbalance is the machine's noise floor. The cost
   model starts, as in the trainer, from a warm-up profile (profile_shards timed on both ranks);
   --live-no-profile starts it from the prior instead. Each shard is timed on the wall clock and on the
   thread's CPU clock (one intra-op thread: all the work is on that thread); both imbalances are
   reported. Measured here they agree within 0.01, so the noise is not the OS's time slicing of 2 ranks
   on 2 cores but the machine's speed varying over time (the same shard timed again varies by 7–26 %),
   which the cost model's per-step speed factor takes out.

    python benchmarks/slicer_imbalance.py                       # everything (several minutes)
    python benchmarks/slicer_imbalance.py --parts profile,table --batches 200 --json out.json

Without ../shared/data (or $STFAST_DATA_DIR) the real samples are replaced by stand-ins of their shape
and the table says so.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from functools import cache
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_geo_conv import source_lengths
from conftest import random_trips

from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from stfast.parallel.slicer import (
    COEFFICIENTS,
    PRIOR,
    LinearCostModel,
    partition,
    predicted_times,
    profile_shards,
    step_time_lower_bound,
)

K = DeepTTEConfig(n_drivers=1).kernel_size
TABLE_METHODS = {"equal": "equal-count random", "sorted": "sorted-strided", "lpt": "LPT on Σlen",
                 "balanced": "balanced (fitted)"}


@cache
def dataset_lengths(name: str) -> tuple[np.ndarray, str]:
    """Trip lengths (points) of a dataset and where they came from (the samples as the geo-conv
    benchmark reads them, stand-ins of their shape without ../shared/data)."""
    if name == "synthetic":
        from stfast.data.synthetic import synthetic_trips

        return synthetic_trips(20000, seed=0).lengths, "synthetic city (20,000 trips)"
    lengths, source = source_lengths(name)
    return lengths, f"{source} ({len(lengths)} trips)"


# ---------------------------------------------------------------- trips of chosen lengths
class LengthPool:
    """Random trips (tests/conftest.random_trips) with lengths 3..max_len; ``pick(lengths)`` returns
    pool trips whose lengths are nearest to the wanted ones (the model sees realistic values)."""

    def __init__(self, max_len: int = 600, n: int = 1800, seed: int = 0):
        self.trips = random_trips(n, seed=seed, min_len=K, max_len=max_len)
        self.vocab = DriverVocab(self.trips.driver)
        self.ds = TripDataset(self.trips, self.vocab)
        self.order = np.argsort(self.ds.lengths, kind="stable")
        self.sorted_lens = self.ds.lengths[self.order]

    def pick(self, lengths: np.ndarray) -> np.ndarray:
        pos = np.clip(np.searchsorted(self.sorted_lens, lengths), 0, len(self.order) - 1)
        return self.order[pos]


def make_model(pool: LengthPool) -> DeepTTE:
    torch.manual_seed(0)
    return DeepTTE(DeepTTEConfig(n_drivers=len(pool.vocab)), NormStats.from_trips(pool.trips))


def fwd_bwd_clocks(model: DeepTTE, ds: TripDataset, idx: np.ndarray, global_b: int) -> tuple[float, float]:
    """(wall, thread CPU) seconds of one shard's forward + backward, as the trainer runs it (loss sum /
    global count). With one intra-op thread all the work runs on this thread (measured here: both clocks
    give the same imbalance, see the module docstring)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    b = ds.batch(idx)
    parts = loss_parts(model, model(b), b)
    n_local = int(np.maximum(ds.lengths[idx] - K + 1, 0).sum())
    combine_loss(parts, model.cfg.alpha, global_b, n_local).backward()
    return time.perf_counter() - t0, time.thread_time() - c0


def fwd_bwd_seconds(model: DeepTTE, ds: TripDataset, idx: np.ndarray, global_b: int) -> float:
    """Wall seconds of one shard's forward + backward (:func:`fwd_bwd_clocks`)."""
    return fwd_bwd_clocks(model, ds, idx, global_b)[0]


# ---------------------------------------------------------------- 1. profile
def profile(n_shards: int, seed: int = 0) -> tuple[LinearCostModel, dict]:
    """Fit the cost model on ``n_shards`` timed shards: sizes 1..64, lengths drawn from all three
    datasets (so short, long and mixed shards are all seen), one thread."""
    torch.set_num_threads(1)
    pool = LengthPool()
    model = make_model(pool)
    rng = np.random.default_rng(seed)
    sources = [dataset_lengths(n)[0] for n in ("chengdu", "geolife", "synthetic")]
    shards, times = [], []
    for i in range(n_shards + 3):
        src = sources[i % 3]
        n = int(rng.integers(1, 65))
        want = rng.choice(src[src >= K], n)
        idx = pool.pick(want)
        model.zero_grad(set_to_none=True)
        t = fwd_bwd_seconds(model, pool.ds, idx, 64)
        if i >= 3:  # warm-up
            shards.append(pool.ds.lengths[idx])
            times.append(t)
    cm = LinearCostModel(window=max(n_shards, 10))
    cm.observe(shards, times)
    cm.fit()
    return cm, {"n_shards": n_shards, "coefficients": cm.to_dict(), "fit_error": cm.fit_error,
                "total_s": float(np.sum(times))}


# ---------------------------------------------------------------- 2. table
def imbalance_table(model: LinearCostModel, n_batches: int, ws=(2, 4, 8, 16, 64), bs=(256, 1024)) -> list[dict]:
    """Per dataset, B and W: the median imbalance of each method, its predicted step time (slowest
    shard) over the balanced slicer's, the balanced slicer's time (ms) and its slowest shard over the
    lower bound (1.0 = provably optimal)."""
    rows = []
    for name in ("chengdu", "geolife", "synthetic"):
        lengths, _ = dataset_lengths(name)
        rng = np.random.default_rng(0)
        for b in bs:
            batches = [rng.choice(lengths, b, replace=b > len(lengths)) for _ in range(n_batches)]
            for w in ws:
                row = {"dataset": name, "B": b, "W": w}
                bal_max = []
                for m in ("balanced", *[x for x in TABLE_METHODS if x != "balanced"]):
                    vals, ms, rel = [], [], []
                    for k, lb in enumerate(batches):
                        t0 = time.perf_counter()
                        asg = partition(lb, w, m, model, seed=k)
                        ms.append(time.perf_counter() - t0)
                        t = predicted_times(lb, asg, w, model)
                        vals.append(t.max() / t.mean())
                        if m == "balanced":
                            bal_max.append(t.max())
                            rel.append(t.max() / step_time_lower_bound(lb, w, model))
                        else:
                            rel.append(t.max() / bal_max[k])
                    row[m] = float(np.median(vals))
                    row[m + "_ms"] = 1e3 * float(np.median(ms))
                    # balanced: slowest shard over the lower bound; others: slowest shard over balanced's
                    row[m + ("_max_over_bound" if m == "balanced" else "_step_vs_balanced")] = float(np.median(rel))
                rows.append(row)
    return rows


def anchor_rows(n_batches: int) -> list[dict]:
    """The issue's anchor: cost Σlen + n·L_max, median of random batches."""
    prior = LinearCostModel(PRIOR)
    out = []
    for name, b, w in (("chengdu", 256, 8), ("geolife", 64, 2), ("geolife", 64, 4)):
        lengths, _ = dataset_lengths(name)
        rng = np.random.default_rng(0)
        row = {"dataset": name, "B": b, "W": w}
        for m in ("equal", "balanced"):
            vals = []
            for k in range(n_batches):
                lb = rng.choice(lengths, b, replace=b > len(lengths))
                t = predicted_times(lb, partition(lb, w, m, prior, seed=k), w, prior)
                vals.append(t.max() / t.mean())
            row[m] = float(np.median(vals))
        out.append(row)
    return out


# ---------------------------------------------------------------- 3. cluster
def simulate_cluster(model: LinearCostModel, dataset: str, ws=(64, 128, 256, 512, 1024), per_rank: int = 32,
                     epoch_trips: int = 1_000_000, n_steps: int = 40) -> list[dict]:
    """Per W: global batch per_rank·W drawn from the dataset's lengths; the epoch's waiting time is
    extrapolated from n_steps sampled steps: Σ_steps Σ_ranks (max_r t_r − t_r)."""
    lengths, _ = dataset_lengths(dataset)
    rows = []
    for w in ws:
        b = per_rank * w
        steps_per_epoch = epoch_trips / b
        rng = np.random.default_rng(w)
        res = {"dataset": dataset, "W": w, "B": b, "steps_per_epoch": steps_per_epoch}
        bound = []
        for m in ("equal", "balanced"):
            imb, idle, step = [], [], []
            for k in range(n_steps):
                lb = rng.choice(lengths, b)
                t = predicted_times(lb, partition(lb, w, m, model, seed=k), w, model)
                imb.append(t.max() / t.mean())
                if m == "balanced":
                    bound.append(t.max() / step_time_lower_bound(lb, w, model))
                idle.append(float((t.max() - t).sum()))
                step.append(float(t.max()))
            res[m + "_imbalance"] = float(np.median(imb))
            res[m + "_wasted_rank_s_per_epoch"] = float(np.mean(idle)) * steps_per_epoch
            res[m + "_epoch_s"] = float(np.mean(step)) * steps_per_epoch
        res["balanced_max_over_bound"] = float(np.median(bound))
        rows.append(res)
    return rows


# ---------------------------------------------------------------- 4. live
def _live_worker(rank: int, world: int, port: int, n_steps: int, batch: int, warmup_profile: bool, clock: str,
                 q) -> None:
    import torch.distributed as dist

    from stfast.parallel import data_parallel as dp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    info = dp.DistInfo(rank, world, rank)
    pool = LengthPool()
    model = make_model(pool)
    src = dataset_lengths("geolife")[0]
    src = src[src >= K]
    rng = np.random.default_rng(7)  # the same global batches on every rank
    cm = LinearCostModel()
    if warmup_profile:  # as the trainer does: time profile_shards on every rank, fit before the first step
        sample = pool.pick(src)  # pool trips with the sample's lengths
        shards = profile_shards(pool.ds.lengths[sample], batch, world, seed=0)
        mine = shards[rank::world]
        fwd_bwd_seconds(model, pool.ds, sample[mine[0]], batch)  # warm-up run, not timed
        ci = 0 if clock == "wall" else 1
        secs = dp.all_gather_floats(np.array([fwd_bwd_clocks(model, pool.ds, sample[sh], batch)[ci] for sh in mine]),
                                    info)
        n = secs.shape[1]  # one observation group, as the trainer's profile
        cm.observe([pool.ds.lengths[sample[shards[r + j * world]]] for r in range(world) for j in range(n)],
                   secs.reshape(-1))
        cm.fit()
        cm.coefficients = dp.broadcast_floats(cm.coefficients, info)
        model.zero_grad(set_to_none=True)
    start = cm.to_dict()
    rec = {"equal": [], "balanced": [], "identical": []}
    params = list(model.parameters())
    for step in range(n_steps + 2):
        idx_g = pool.pick(rng.choice(src, batch, replace=batch > len(src)))
        lens_g = pool.ds.lengths[idx_g]
        # "identical": every rank computes the same shard (the noise floor of the measured imbalance)
        order = ("balanced", "equal", "identical") if step % 2 == 0 else ("identical", "equal", "balanced")
        for m in order:
            asg = partition(lens_g, world, "equal" if m == "identical" else m, cm, seed=step)
            mine = idx_g[asg == 0] if m == "identical" else idx_g[asg == rank]
            dist.barrier()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            compute = fwd_bwd_clocks(model, pool.ds, mine, batch) if len(mine) else (0.0, 0.0)
            dp.all_reduce_gradients(params, info)
            step_s = time.perf_counter() - t0
            both = dp.all_gather_floats(np.array(compute), info)  # [W, (wall, cpu)]
            times, cpu = both[:, 0], both[:, 1]
            shards = [lens_g[asg == (0 if m == "identical" else r)] for r in range(world)]
            pred = np.array([cm.predict(sh) for sh in shards])
            cm.observe(shards, times if clock == "wall" else cpu)
            if step >= 2:  # warm-up steps are not recorded
                rec[m].append({"compute_s": times.tolist(), "compute_cpu_s": cpu.tolist(), "step_s": step_s,
                               "measured_imbalance": float(times.max() / times.mean()),
                               "measured_imbalance_cpu": float(cpu.max() / cpu.mean()),
                               "predicted_imbalance": float(pred.max() / pred.mean()),
                               "shard_trips": [len(s) for s in shards]})
        if step % 5 == 4:
            cm.fit()
            cm.coefficients = dp.broadcast_floats(cm.coefficients, info)
    if rank == 0:
        q.put({"records": rec, "coefficients": cm.to_dict(), "fit_error": cm.fit_error, "start_coefficients": start})
    dp.shutdown(wait_for_peers=True)


def live(n_steps: int, batch: int, warmup_profile: bool = True, clock: str = "cpu") -> dict:
    """The live part (module docstring, 4). ``clock``: what the cost model is fitted to, each shard's
    wall seconds or its thread CPU seconds; both imbalances are reported either way."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_live_worker, args=(r, 2, port, n_steps, batch, warmup_profile, clock, q)) for r in range(2)]
    for p in procs:
        p.start()
    out = q.get(timeout=3600)
    for p in procs:
        p.join()
    rec = out["records"]
    summ = {}
    for m in rec:
        summ[m] = {"median_measured_imbalance": float(np.median([r["measured_imbalance"] for r in rec[m]])),
                   "median_measured_imbalance_cpu": float(np.median([r["measured_imbalance_cpu"] for r in rec[m]])),
                   "median_predicted_imbalance": float(np.median([r["predicted_imbalance"] for r in rec[m]])),
                   "median_step_s": float(np.median([r["step_s"] for r in rec[m]])),
                   "mean_step_s": float(np.mean([r["step_s"] for r in rec[m]]))}
    paired = [e["step_s"] / b["step_s"] for e, b in zip(rec["equal"], rec["balanced"])]
    summ["speedup_median_of_paired_ratios"] = float(np.median(paired))
    summ["speedup_ratio_of_mean_step_s"] = summ["equal"]["mean_step_s"] / summ["balanced"]["mean_step_s"]
    summ["steps"] = len(paired)
    summ["coefficients"], summ["fit_error"] = out["coefficients"], out["fit_error"]
    summ["start_coefficients"], summ["warmup_profile"] = out["start_coefficients"], warmup_profile
    summ["clock"] = clock
    summ["records"] = rec
    return summ


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="profile,table,cluster,live")
    ap.add_argument("--profile-shards", type=int, default=150)
    ap.add_argument("--coefficients", default=None, help="a,b,c,d,e instead of profiling")
    ap.add_argument("--batches", type=int, default=200, help="random global batches per table cell")
    ap.add_argument("--live-steps", type=int, default=30)
    ap.add_argument("--live-batch", type=int, default=64)
    ap.add_argument("--live-no-profile", action="store_true",
                    help="live: start the cost model from the prior (no warm-up profile), as before the profile")
    ap.add_argument("--live-clock", choices=("cpu", "wall"), default="cpu",
                    help="live: fit the cost model to each shard's thread CPU seconds (default) or to its wall "
                         "seconds; both imbalances are reported (measured here, they agree within 0.01)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    parts = set(a.parts.split(","))
    result: dict = {"machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"}
    print(result["machine"])
    for name in ("chengdu", "geolife", "synthetic"):
        print(f"{name}: {dataset_lengths(name)[1]}")
    if a.coefficients:
        model = LinearCostModel([float(v) for v in a.coefficients.split(",")])
    elif "profile" in parts:
        model, prof = profile(a.profile_shards)
        result["profile"] = prof
        print(f"\nfitted on {prof['n_shards']} timed shards ({prof['total_s']:.0f} s of fwd+bwd): "
              + ", ".join(f"{k} = {v:.3g}" for k, v in prof["coefficients"].items())
              + f"; relative error: median {prof['fit_error']['rel_median']:.3f}, "
              f"RMS {prof['fit_error']['rel_rmse']:.3f} (stalls of the shared machine included)")
        print("  standard errors: " + ", ".join(f"{k} {'-' if s is None else f'{s:.2g}'}"
                                              for k, s in zip(COEFFICIENTS, prof["fit_error"]["stderr"])))
    else:
        model = LinearCostModel()
    result["model"] = model.to_dict()
    if "table" in parts:
        print(f"\nanchor (cost Σlen + n·L_max, median of {a.batches} random batches): equal-count → balanced")
        result["anchor"] = anchor_rows(a.batches)
        for r in result["anchor"]:
            print(f"  {r['dataset']:<9} B {r['B']:>4} W {r['W']:>3}: {r['equal']:.3f} → {r['balanced']:.3f}")
        for label, cm in (("the fitted model", model), ("the anchor cost Σlen + n·L_max", LinearCostModel(PRIOR))):
            print(f"\npredicted imbalance max/mean under {label}, median of {a.batches} random batches; in "
                  "brackets the step time (slowest shard) over the balanced slicer's; max/LB: the balanced "
                  "slicer's slowest shard over a lower bound for any partition (slicer.step_time_lower_bound)")
            print(f"{'dataset':<10}{'B':>5}{'W':>4}  " + "".join(f"{v:>20}" for v in TABLE_METHODS.values())
                  + f"{'max/LB':>8}{'ms':>7}")
            rows = imbalance_table(cm, a.batches)
            result["table" if cm is model else "table_anchor_cost"] = rows
            for r in rows:
                flag = "  *" if r["B"] / r["W"] >= 16 and r["balanced"] > 1.03 else ""
                cells = [f"{r[m]:.3f} ({r[m + '_step_vs_balanced']:.2f})" if m != "balanced" else f"{r[m]:.3f}"
                         for m in TABLE_METHODS]
                print(f"{r['dataset']:<10}{r['B']:>5}{r['W']:>4}  " + "".join(f"{c:>20}" for c in cells)
                      + f"{r['balanced_max_over_bound']:>8.3f}{r['balanced_ms']:>7.2f}{flag}")
            worst = max(r["balanced"] for r in rows if r["B"] / r["W"] >= 16)
            print(f"worst balanced where B/W ≥ 16: {worst:.4f} (target ≤ 1.03; * marks the cells above it)")
    if "cluster" in parts:
        print("\nsimulated cluster (fitted model, i.e. seconds of this CPU; 32 trips per rank; an epoch of 1,000,000 "
              "trips drawn from the lengths; waiting = Σ over steps and ranks of slowest − own)")
        print(f"{'dataset':<10}{'W':>5}{'B':>7}  {'imbalance equal':>16}{'balanced':>10}"
              f"{'waiting rank-s/epoch equal':>28}{'balanced':>10}{'epoch s equal':>15}{'balanced':>10}{'max/LB':>8}")
        result["cluster"] = []
        for ds in ("chengdu", "geolife"):
            for r in simulate_cluster(model, ds):
                result["cluster"].append(r)
                print(f"{r['dataset']:<10}{r['W']:>5}{r['B']:>7}  {r['equal_imbalance']:>16.3f}{r['balanced_imbalance']:>10.3f}"
                      f"{r['equal_wasted_rank_s_per_epoch']:>28.0f}{r['balanced_wasted_rank_s_per_epoch']:>10.0f}"
                      f"{r['equal_epoch_s']:>15.1f}{r['balanced_epoch_s']:>10.1f}{r['balanced_max_over_bound']:>8.3f}")
    if "live" in parts:
        print(f"\nlive: 2 Gloo ranks x 1 thread, GeoLife lengths, global batch {a.live_batch}, "
              f"{a.live_steps} steps of each slicer interleaved on the same batches (identical: both ranks "
              "compute the same shard, the noise floor of the measured imbalance)")
        lv = live(a.live_steps, a.live_batch, warmup_profile=not a.live_no_profile, clock=a.live_clock)
        result["live"] = lv
        print(("  cost model at the first step (warm-up profile): " if lv["warmup_profile"] else
               "  cost model at the first step (the prior, no warm-up profile): ")
              + ", ".join(f"{k} {v:.3g}" for k, v in lv["start_coefficients"].items()))
        for m in ("equal", "balanced", "identical"):
            s = lv[m]
            print(f"  {m:<9} measured imbalance {s['median_measured_imbalance']:.3f} wall, "
                  f"{s['median_measured_imbalance_cpu']:.3f} thread CPU (predicted {s['median_predicted_imbalance']:.3f}, "
                  f"model fitted to {lv['clock']} time), step {s['median_step_s']:.3f} s median, "
                  f"{s['mean_step_s']:.3f} s mean")
        print(f"  speed-up balanced vs equal: {lv['speedup_median_of_paired_ratios']:.3f}x (median of paired steps), "
              f"{lv['speedup_ratio_of_mean_step_s']:.3f}x (ratio of mean step times)")
        print(f"  load average now {os.getloadavg()[0]:.1f} (shared machine: timings are noisy)")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
