"""Does the no-extra-backward gradient-noise-scale estimate (stfast.accum.noise: units = one rank's shard of
one micro-batch) agree with B_simple computed from per-trip gradients, when the units are the shards that
the ranks actually get?

For DeepTTE on the synthetic city (global batch B, at initialization and after training), per batch:
- exact: tr(Σ) from the B per-trip gradients (the loss of one trip, its mean-gradient form), |G|² from
  the batch gradient minus tr(Σ)/B (McCandlish et al. 2018, Appendix A), averaged over batches;
- the unit estimator (noise_estimates) with the batch split into W units: at random (what the estimator
  assumes), by the balanced slicer (stfast.parallel.slicer.partition, the fitted CPU cost model) and
  sorted by length into contiguous halves.
Estimates of tr(Σ) and |G|² are averaged over the batches first and divided afterwards, as the EMA does.

    python benchmarks/noise_scale_units.py [--batches 6] [--batch-size 64] [--world-size 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from stfast.accum.noise import noise_estimates
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.data.synthetic import synthetic_trips
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from stfast.parallel.slicer import LinearCostModel, partition

# the cost model fitted on this CPU (README, load balance): a, b, c, d, e
CPU_COST = (0.011048642683591653, 0.0, 1.1157545301093674e-05, 1.5998237859478548e-05, 1.2811881111460965e-05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=100, help="Adam steps between the measured phases")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    trips = synthetic_trips(3000, seed=0)
    lengths = np.diff(trips.offsets)
    vocab = DriverVocab(trips.driver)
    ds = TripDataset(trips, vocab)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    params = [p for p in model.parameters() if p.requires_grad]
    cost = LinearCostModel(CPU_COST)

    def loss_of(idx):
        b = ds.batch(np.asarray(idx))
        p = loss_parts(model, model(b), b)
        return combine_loss(p, model.cfg.alpha, len(idx), p.n_local, False)  # entire loss: per-trip means

    def grad_of(idx):
        model.zero_grad(set_to_none=True)
        loss_of(idx).backward()
        return torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1).double()
                          for q in params])

    rng = np.random.default_rng(0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    B, W = a.batch_size, a.world_size
    rows = []
    for phase in range(3):
        for _ in range(a.train_steps if phase else 0):
            opt.zero_grad()
            loss_of(rng.choice(len(lengths), B, replace=False)).backward()
            opt.step()
        acc = {"exact": [], "random": [], "balanced_slicer": [], "sorted_halves": []}
        for _ in range(a.batches):
            idx = rng.choice(len(lengths), B, replace=False)
            per = torch.stack([grad_of([i]) for i in idx])
            gbar = per.mean(0)
            tr = float((per - gbar).square().sum(1).mean()) * B / (B - 1)
            acc["exact"].append((float(gbar.square().sum()) - tr / B, tr))
            big_sq = float(grad_of(idx).square().sum())
            shard = partition(lengths[idx].astype(float), W, "balanced", cost)
            splits = {"random": np.array_split(rng.permutation(idx), W),
                      "balanced_slicer": [idx[shard == r] for r in range(W)],
                      "sorted_halves": np.array_split(idx[np.argsort(lengths[idx], kind="stable")], W)}
            for name, units in splits.items():
                units = [u for u in units if len(u)]
                sq = [float(grad_of(u).square().sum()) for u in units]
                b_small = len(units) / sum(1.0 / len(u) for u in units)
                acc[name].append(noise_estimates(float(np.mean(sq)), b_small, big_sq, B))
        row = {"phase": phase, "adam_steps": phase * a.train_steps}
        for name, v in acc.items():
            g2, tr = (float(np.mean(x)) for x in zip(*v))
            row[name] = {"b_simple": tr / g2, "trace": tr, "g2": g2}
        rows.append(row)
        print(f"after {row['adam_steps']:4d} steps: " + " | ".join(
            f"{n} {row[n]['b_simple']:8.1f}" for n in acc), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
