"""Gradient accumulation chosen by a scheduler (goodput or RL) in a hand-written training loop.

    python examples/accumulation_loop.py --scheduler goodput
    python examples/accumulation_loop.py --scheduler rl

The loop uses stfast's AccumulationController, the object stfast's own trainer uses: every window of W
optimizer steps it hands the scheduler what it measured (stfast.accum.WindowStats: k, trips, wall time,
gradient noise scale), takes the next k and sets the learning rate for the effective batch k·B (the sqrt
rule for Adam). The gradient noise scale comes from the micro-steps' gradients (stfast.accum.noise),
without extra backward passes; at k = 1 in one process from consecutive steps.
"""
from __future__ import annotations

import argparse
import time

import torch
from _sequences import SeqRegressor, make_sequences

from stfast.accum.controller import AccumulationController
from stfast.accum.schedulers import make_scheduler


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
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    # one process: nothing to reduce over ranks (give reduce=, world_size=, rank= under torch.distributed);
    # the plain noise scale B_simple, which needs no Adam warm-up
    ctl = AccumulationController(make_scheduler(a.scheduler, seed=0), model.parameters(), a.micro_batch, a.window,
                                 opt, noise_scale="plain", lr_scaling="sqrt")
    gen = torch.Generator().manual_seed(1)
    chosen, step_loss = [], float("nan")
    ctl.start_clock()
    for w in range(a.windows):
        chosen.append(ctl.k)
        while not ctl.window_due():
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            ctl.begin_step()
            n_total, step_loss = ctl.k * a.micro_batch, 0.0
            for j in range(ctl.k):  # micro-steps: sum of squared errors / all trips of the optimizer step
                idx = torch.randint(0, len(seqs), (a.micro_batch,), generator=gen)
                loss = (model([seqs[i] for i in idx]) - target[idx]).square().sum() / n_total
                loss.backward()
                ctl.after_micro_step(len(idx), n_total, last=j == ctl.k - 1)
                step_loss += loss.item()
            reduced = ctl.extra(step_loss)  # what an all-reduce would sum with the gradients
            opt.step()
            ctl.end_step(reduced, n_total, step_s=time.perf_counter() - t0, sync_s=0.0)
        budget_used = (w + 1) / a.windows
        stats = ctl.window_stats(budget_used)  # the scheduler steers by the noise scale's lower confidence bound
        print(f"window: k={ctl.k:2d}  {stats.samples_per_s:7.1f} trips/s  loss {step_loss:8.3f}  "
              f"noise scale {ctl.noise.value:9.1f} trips (lower bound {ctl.noise.lower_confidence():9.1f})", flush=True)
        ctl.end_window(budget_used, out_of_time=False)  # the next k, and the learning rate for it
    print(f"k per window: {chosen}")
    # noise scale: nan while the |G|² estimate is not positive (the estimate's noise exceeds the signal)
    noise = ctl.noise
    return {"k": chosen, "final_loss": step_loss, "noise_scale": noise.value, "noise_updates": noise.n,
            "g2": noise.g2, "trace": noise.trace, "noise_scale_bound": noise.lower_confidence()}


if __name__ == "__main__":
    main()
