"""Can the gradient noise scale measured in a run's first optimizer steps tell a data set that wants k = 4 from
the first step (the Chengdu sample at 2 ranks) from one that wants k = 1 (the synthetic city)? The start of an
adaptive accumulation scheduler (--accum-start) would need that (docs/accumulation.md, "The start").

One process, `--preset paper`, batch 32, fixed k = 1 (the trainer's own steps). At optimizer steps 0, 8, 16, 32,
50 and 100 the training pauses, and M probe micro-batches (drawn from another shuffle of the training trips)
each get one backward at the current weights, with no step. From their mean gradients g_m (b trips each, over
stfast.accum.noise.noise_parameters) and their mean g (M·b trips), McCandlish et al.'s unbiased estimates
(2018, Appendix A; stfast.accum.noise.noise_estimates) give

- B_simple = tr(Σ)/|G|² (trips);
- B_probe = the same on P·g with P = 1/(√mean_m(g_m²) + 1e-8): Adam's preconditioner as it would read from
  these M gradients alone, the only one a run has before Adam's 50-step warm-up (ADAM_WARMUP_STEPS).

    python benchmarks/noise_scale_early.py --data synthetic --seeds 4 5
    python benchmarks/noise_scale_early.py --data ../shared/data/chengdu_deeptte_sample/test --seeds 10 11

Prints one line per seed and step. Measured (2026-12-03, docs/accumulation.md, "The start"): the ranges of the two data
sets overlap at every step, so neither estimate chooses the start.
"""
from __future__ import annotations

import argparse
import tempfile

import torch

from stfast.accum.noise import noise_estimates, noise_parameters
from stfast.models.deeptte import local_count, training_loss
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer

PROBE_STEPS = (0, 8, 16, 32, 50, 100)


def micro_gradient(tr: Trainer, trips, params) -> torch.Tensor:
    """The mean gradient [P] (float64, the noise parameters flattened) of one micro-batch at the current
    weights; the optimizer does not step and the gradients are cleared again."""
    lengths, kernel = tr.data.train_ds.lengths, tr.model.cfg.kernel_size
    n, n_local = len(trips), local_count(lengths[trips], kernel)
    tr.opt.zero_grad(set_to_none=True)
    tr.steps.begin_step()
    tr.steps.micro_step(trips, True, lambda out, b: training_loss(tr.model, out, b, n, n_local, True))
    g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
    tr.opt.zero_grad(set_to_none=True)
    return g


def noise_scales(grads: torch.Tensor, b: int) -> tuple[float, float]:
    """(B_simple, B_probe) in trips from M micro-batch mean gradients [M, P] of b trips each."""
    m = grads.shape[0]
    out = []
    for w in (torch.ones(grads.shape[1], dtype=grads.dtype), 1.0 / (grads.pow(2).mean(0).sqrt() + 1e-8)):
        gw = grads * w
        g2, trace = noise_estimates(gw.pow(2).sum(1).mean().item(), b, gw.mean(0).pow(2).sum().item(), m * b)
        out.append(trace / g2)
    return out[0], out[1]


def run(data: str, seed: int, probe_batches: int) -> list[tuple[int, float, float]]:
    kw = {"n_synthetic": 1500} if data == "synthetic" else {"data": data, "format": "deeptte"}
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(preset="paper", accumulation="fixed:1", batch_size=32, accum_window=4, seed=seed,
                          data_seed=0, ema_decay=0.97, epochs=100, threads=2, progress=False, out=out, **kw)
        tr = Trainer(cfg)
        try:
            params = noise_parameters(tr.model)
            rows, step, epoch, batches, bi = [], 0, 0, tr.data.epoch_batches(32, seed, 0), 0
            for target in PROBE_STEPS:
                while step < target:
                    if bi == len(batches):
                        epoch, bi = epoch + 1, 0
                        batches = tr.data.epoch_batches(32, seed, epoch)
                    tr.train_step(batches[bi], True)
                    bi, step = bi + 1, step + 1
                # another shuffle than training's; full micro-batches only (the estimator takes one size b)
                probe = [m for m in tr.data.epoch_batches(32, seed + 1000, step) if len(m) == 32]
                grads = torch.stack([micro_gradient(tr, probe[i % len(probe)], params) for i in range(probe_batches)])
                rows.append((step, *noise_scales(grads, len(probe[0]))))
        finally:
            tr.release_out_dir()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="synthetic", help="synthetic, or a DeepTTE JSON-lines file or folder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[4, 5])
    ap.add_argument("--probe-batches", type=int, default=16, help="micro-batches per probe (M)")
    a = ap.parse_args(argv)
    for seed in a.seeds:
        for step, simple, probe in run(a.data, seed, a.probe_batches):
            print(f"{a.data} seed {seed} step {step}: B_simple {simple:.1f} trips, B_probe {probe:.1f} trips", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
