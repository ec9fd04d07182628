"""Does the no-extra-backward gradient-noise-scale estimate (stfast.accum.noise) agree with B_simple from
per-trip gradients when its units are the shards the ranks actually get?

The trainer's units are one rank's shard of one micro-batch; the estimator (McCandlish et al. 2018,
Appendix A) assumes they are random subsets of the optimizer step's trips. The balanced slicer groups
trips by length instead. This script measures the consequence for DeepTTE on the synthetic city (or any
trips), with the trainer's loss (entire + local, means over the step's trips and segments):

- per trip i of a step, its contribution c_i to the step's gradient times the step's trip count (the
  step gradient is the mean of the c_i, as the trainer's loss scaling makes it) — one backward each;
- exact: tr(Σ) = the c_i's variance (unbiased), |G|² = |mean c|² − tr(Σ)/n;
- the unit estimator at k = 1 (units: the W shards of one micro-batch of B trips) and k = 2 (the W shards
  of each of two micro-batches, step = 2B trips), with the shards drawn at random (what the estimator
  assumes), by the balanced slicer (stfast.parallel.slicer.partition, the cost model fitted on this CPU)
  and as sorted contiguous length ranges. A unit's mean gradient is the mean of its c_i (exact: the loss
  is a sum over trips), so no further backward is needed;
- a cross-step estimator that needs no units (a candidate, not in stfast): |G|² from the inner product of
  consecutive optimizer steps' gradients (lag 1 and 2), tr(Σ) from the step's own |g|² beyond it. The
  measured steps are real Adam steps (the k = 1 step's gradient), so the parameters move between them as
  in training. Measured (2026-11-30): 2.8–3.3× the exact B_simple at lag 1, negative at lag 2 — an Adam
  step along g_{t−1} turns the next gradient against it, so ⟨g_t, g_{t−1}⟩ understates |G|².
- the preconditioned noise scale (Pollux, Qiao et al. OSDI 2021, §3.1: tr(PΣPᵀ)/|PG|², for Adam
  P = diag(1/(√v̂ + ε)) from the optimizer's second moments), exact from the same c_i, once Adam has
  taken a step: is it where the plain B_simple is too pessimistic for Adam? (Elements Adam has seen
  no gradient for, such as the embedding rows of drivers outside its trips, are left out.)
tr(Σ) and |G|² are averaged over the steps first and divided afterwards, as the trainer's EMA does.

    python benchmarks/noise_scale_units.py [--steps 12] [--batch-size 32] [--world-size 2] [--json out.json]
        [--init RUN/last.pt]   (the weights a training run ended with, instead of a fresh model, and its
                               Adam state, so the preconditioned estimate is there from the first step)
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
from stfast.train import checkpoint as ckpt
from stfast.train.trained import load_model

# the cost model fitted on this CPU (README, load balance): a, b, c, d, e
CPU_COST = (0.011048642683591653, 0.0, 1.1157545301093674e-05, 1.5998237859478548e-05, 1.2811881111460965e-05)
SPLITS = ("random", "balanced_slicer", "sorted")


def cross_step_estimates(big_sq: float, b_big: float, cross: float) -> tuple[float, float]:
    """(|G|², tr(Σ)) from a step's |g_t|² over b_big trips (E = |G|² + tr(Σ)/b_big) and ⟨g_t, g_{t−lag}⟩ on
    independent trips (E ≈ |G|² if G did not move)."""
    return cross, b_big * (big_sq - cross)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="measured optimizer steps per phase")
    ap.add_argument("--batch-size", type=int, default=32, help="global micro-batch B (trips)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=150, help="Adam steps (batch B) before each later phase")
    ap.add_argument("--phases", type=int, default=3)
    ap.add_argument("--n-synthetic", type=int, default=1500)
    ap.add_argument("--json", default=None)
    ap.add_argument("--init", default=None, help="start from this stfast checkpoint's weights (e.g. a run's last.pt "
                    "on the same synthetic city): is B_simple where a run at some k ended up different?")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    trips = synthetic_trips(a.n_synthetic, seed=0)
    lengths = np.diff(trips.offsets)
    torch.manual_seed(0)
    if a.init:
        trained = load_model(a.init)
        model, vocab = trained.model.train(), trained.drivers
    else:
        vocab = DriverVocab(trips.driver)
        model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    ds = TripDataset(trips, vocab, next(model.parameters()).dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    cost = LinearCostModel(CPU_COST)
    k_conv = model.cfg.kernel_size

    def step_loss(idx, n_trips, n_local):
        b = ds.batch(np.asarray(idx))
        return combine_loss(loss_parts(model, model(b), b), model.cfg.alpha, n_trips, n_local, True)

    def contributions(idx):
        """[n, P] float64: each trip's gradient contribution to the step over idx, times n."""
        n_local = int(np.maximum(lengths[idx] - k_conv + 1, 0).sum())
        out = []
        for i in idx:
            model.zero_grad(set_to_none=True)
            step_loss([i], len(idx), n_local).backward()
            out.append(torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1).double()
                                  for q in params]) * len(idx))
        return torch.stack(out)

    def units_of(micro, how, rng):
        if how == "random":
            return np.array_split(rng.permutation(len(micro)), a.world_size)
        if how == "sorted":
            return np.array_split(np.argsort(lengths[micro], kind="stable"), a.world_size)
        shard = partition(lengths[micro].astype(float), a.world_size, "balanced", cost)
        return [np.flatnonzero(shard == r) for r in range(a.world_size)]

    def unit_estimate(c, unit_rows):
        unit_rows = [u for u in unit_rows if len(u)]
        small_sq = float(np.mean([float(c[u].mean(0).square().sum()) for u in unit_rows]))
        b_small = len(unit_rows) / sum(1.0 / len(u) for u in unit_rows)
        return noise_estimates(small_sq, b_small, float(c.mean(0).square().sum()), len(c))

    rng = np.random.default_rng(0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    if a.init and "optimizer_state" in (saved := ckpt.load(a.init)):
        opt.load_state_dict(saved["optimizer_state"])  # the run's second moments: its preconditioner
        for group in opt.param_groups:
            group["lr"] = 1e-3

    def adam_preconditioner():
        """[P] float64: Adam's 1/(√v̂ + ε) per parameter element (bias-corrected v; 0 where v = 0), None before
        its first step."""
        (_, beta2), eps = opt.param_groups[0]["betas"], opt.param_groups[0]["eps"]
        if not all("exp_avg_sq" in opt.state.get(q, {}) for q in params):
            return None
        v = torch.cat([(opt.state[q]["exp_avg_sq"] / (1 - beta2 ** float(opt.state[q]["step"]))).reshape(-1).double()
                       for q in params])
        # elements Adam never had a gradient for (v = 0: drivers outside the trips it trained on) would get
        # 1/ε and swamp the rest; they are left out (weight 0)
        return torch.where(v > 0, 1.0 / (v.sqrt() + eps), 0.0)

    def exact(c):
        """(|G|², tr(Σ)) from the c_i [n, P], unbiased."""
        n = len(c)
        tr = float((c - c.mean(0)).square().sum(1).sum()) / (n - 1)
        return float(c.mean(0).square().sum()) - tr / n, tr
    B = a.batch_size
    rows = []
    for phase in range(a.phases):
        for _ in range(a.train_steps if phase else 0):
            idx = rng.choice(len(lengths), B, replace=False)
            opt.zero_grad()
            step_loss(idx, B, int(np.maximum(lengths[idx] - k_conv + 1, 0).sum())).backward()
            opt.step()
        acc = {"exact": [], "exact_adam_preconditioned": []} | {f"k{k}_{s}": [] for k in (1, 2) for s in SPLITS} | {
            "cross_step": [], "cross_step_lag2": []}
        history = []  # the measured steps' gradients, newest last
        for _ in range(a.steps):
            for k in (1, 2):
                micro = [rng.choice(len(lengths), B, replace=False) for _ in range(k)]
                idx = np.concatenate(micro)
                c = contributions(idx)
                if k == 1:
                    acc["exact"].append(exact(c))
                    pre = adam_preconditioner()
                    if pre is not None:
                        acc["exact_adam_preconditioned"].append(exact(c * pre))
                    g = c.mean(0)
                for s in SPLITS:
                    rows_u = []
                    for j, m in enumerate(micro):
                        rows_u += [u + j * B for u in units_of(m, s, rng)]
                    acc[f"k{k}_{s}"].append(unit_estimate(c, rows_u))
            for lag, name in ((1, "cross_step"), (2, "cross_step_lag2")):
                if len(history) >= lag:
                    acc[name].append(cross_step_estimates(float(g.square().sum()), B, float(g @ history[-lag])))
            history = (history + [g])[-2:]
            # an Adam step with the k = 1 step's gradient, so the next step's parameters have moved
            off = 0
            for q in params:
                q.grad = g[off:off + q.numel()].view_as(q).to(q.dtype).clone()
                off += q.numel()
            opt.step()
        row = {"phase": phase, "adam_steps": phase * a.train_steps}
        for name, v in acc.items():
            if not v:  # a lag longer than the measured steps, or no Adam step yet
                continue
            g2, tr = (float(np.mean(x)) for x in zip(*v))
            row[name] = {"b_simple": tr / g2, "trace": tr, "g2": g2}
        rows.append(row)
        print(f"after {row['adam_steps']:4d} Adam steps, B_simple (trips): " + " | ".join(
            f"{n} {row[n]['b_simple']:.1f}" for n in acc if n in row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
