"""Gradient accumulation chosen by a scheduler (goodput or RL) in a hand-written training loop.

    python examples/accumulation_loop.py --scheduler goodput
    python examples/accumulation_loop.py --scheduler rl

Every window of W optimizer steps the loop hands the scheduler what it measured (stfast.accum.WindowStats:
k, trips, wall time, gradient noise scale) and gets the next k. The gradient noise scale comes from the
micro-steps' gradients (stfast.accum.noise), without extra backward passes.
"""
from __future__ import annotations

import argparse
import time

import torch
from _sequences import SeqRegressor, make_sequences

from stfast.accum.goodput import lr_scale
from stfast.accum.noise import GradientNoiseScale, UnitGradients
from stfast.accum.schedulers import make_scheduler
from stfast.accum.window import WindowStats


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheduler", default="goodput", help="goodput, rl or fixed:K")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--window", type=int, default=5, help="optimizer steps per scheduler decision")
    ap.add_argument("--windows", type=int, default=6)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    seqs, target = make_sequences(2000)
    model = SeqRegressor()
    base_lr = 3e-3
    opt = torch.optim.Adam(model.parameters(), lr=base_lr)
    scheduler = make_scheduler(a.scheduler, seed=0)
    units, noise = UnitGradients(model.parameters()), GradientNoiseScale()
    k, pos, chosen = 1, 0, []
    gen = torch.Generator().manual_seed(1)
    for _ in range(a.windows):
        t0, trips, loss_first, loss_last = time.perf_counter(), 0, None, None
        for _ in range(a.window):
            opt.zero_grad(set_to_none=True)
            units.begin()
            n_total = k * a.micro_batch
            step_loss = 0.0
            for _ in range(k):  # micro-steps: sum of squared errors / all trips of the optimizer step
                idx = torch.randint(0, len(seqs), (a.micro_batch,), generator=gen)
                # each micro-batch backpropagated in two halves: two gradient "units" even at k = 1, so the
                # noise scale (which compares unit gradients with the step's) is measurable from the start
                for half in idx.chunk(2):
                    loss = (model([seqs[i] for i in half]) - target[half]).square().sum() / n_total
                    loss.backward()
                    units.after_micro_step(len(half), n_total)
                    step_loss += loss.item()
            big_sq = float(sum(p.grad.double().square().sum() for p in model.parameters()))
            noise.update(units.units.as_array(), big_sq, n_total)
            opt.step()
            trips += n_total
            pos += 1
            loss_first = step_loss if loss_first is None else loss_first
            loss_last = step_loss
        stats = WindowStats(k=k, micro_batch=a.micro_batch, steps=a.window, trips=trips,
                            wall_s=time.perf_counter() - t0, comm_s=0.0,
                            loss_slope=(loss_last - loss_first) / abs(loss_first),
                            # the scheduler steers by a lower confidence bound, as stfast's trainer does: the
                            # point estimate jumps when the |G|² average passes near zero
                            noise_scale=noise.lower_confidence(),
                            budget_used=min(1.0, pos / (a.window * a.windows)))
        chosen.append(k)
        print(f"window: k={k:2d}  {stats.samples_per_s:7.1f} trips/s  loss {loss_last:8.3f}  "
              f"noise scale {noise.value:9.1f} trips (lower bound {noise.lower_confidence():9.1f})", flush=True)
        k = scheduler.observe(stats)
        for group in opt.param_groups:  # effective batch k·B: the sqrt rule for Adam
            group["lr"] = base_lr * lr_scale(k, "sqrt")
    print(f"k per window: {chosen}")
    # noise scale: nan while the |G|² estimate is not positive (the estimate's noise exceeds the signal)
    return {"k": chosen, "final_loss": loss_last, "noise_scale": noise.value, "noise_updates": noise.n,
            "g2": noise.g2, "trace": noise.trace, "noise_scale_bound": noise.lower_confidence()}


if __name__ == "__main__":
    main()
