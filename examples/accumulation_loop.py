"""Gradient accumulation chosen by a scheduler (goodput or RL) in a hand-written training loop, in one line.

    python examples/accumulation_loop.py --scheduler goodput
    python examples/accumulation_loop.py --scheduler rl

The loop iterates over ``ctl.micro_batches(...)`` (stfast.accum.AccumulationController, the object stfast's
own trainer uses) and writes forward and backward as in plain PyTorch, with ``micro.backward(loss)`` for
``loss.backward()`` (as Accelerate's ``accelerator.backward``). The iterator groups the micro-batches k at a
time, steps the optimizer after each group, and every window of W optimizer steps hands the scheduler what it
measured (stfast.accum.WindowStats: k, trips, wall time, gradient noise scale), takes the next k and sets the
learning rate for the effective batch k·B (the sqrt rule for Adam). The gradient noise scale comes from the
micro-steps' gradients (stfast.accum.noise), without extra backward passes; at k = 1 in one process from
consecutive steps.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator

import torch
from _sequences import SeqRegressor, make_sequences

from stfast.accum.controller import AccumulationController
from stfast.accum.schedulers import make_scheduler


def random_micro_batches(seqs: list[torch.Tensor], target: torch.Tensor, micro_batch: int,
                         gen: torch.Generator) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
    """Endless micro-batches of ``micro_batch`` sequences drawn at random: (sequences [L_i, F], targets [b])."""
    while True:
        idx = torch.randint(0, len(seqs), (micro_batch,), generator=gen)
        yield [seqs[i] for i in idx], target[idx]


def train(model: torch.nn.Module, ctl: AccumulationController, data: Iterable, windows: int) -> list[int]:
    """Train ``model`` on the micro-batches of ``data`` ((sequences, targets [b]) pairs) for ``windows``
    windows of ``ctl.window`` optimizer steps, k micro-batches each as ``ctl``'s scheduler decides; the loss is
    the mean squared error. Returns k per window."""
    chosen = [ctl.k]

    def report(row: dict) -> None:  # each window's metrics (row["noise_scale"]: its lower confidence bound)
        print(f"window: k={row['k']:2d}  {row['samples_per_s']:7.1f} trips/s  loss EMA {row['loss_ema']:8.3f}  "
              f"noise scale {row['noise_scale_point'] or float('nan'):9.1f} trips "
              f"(lower bound {row['noise_scale'] or float('nan'):9.1f})", flush=True)
        chosen.append(row["k_next"])

    for micro in ctl.micro_batches(data, budget_used=lambda: (ctl.n_windows + 1) / windows,
                                   size=lambda b: len(b[1]), on_window=report):
        if ctl.n_windows == windows:
            break
        seqs, y = micro.batch
        micro.backward((model(seqs) - y).square().mean())
    return chosen[:windows]


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
    # one process; the plain noise scale B_simple, which needs no Adam warm-up
    ctl = AccumulationController(make_scheduler(a.scheduler, seed=0), model.parameters(), a.micro_batch, a.window,
                                 opt, noise_scale="plain", lr_scaling="sqrt")
    chosen = train(model, ctl, random_micro_batches(seqs, target, a.micro_batch, torch.Generator().manual_seed(1)),
                   a.windows)
    print(f"k per window: {chosen}")
    # noise scale: nan while the |G|² estimate is not positive (the estimate's noise exceeds the signal)
    noise = ctl.noise
    return {"k": chosen, "final_loss": ctl.loss_ema, "noise_scale": noise.value, "noise_updates": noise.n,
            "g2": noise.g2, "trace": noise.trace, "noise_scale_bound": noise.lower_confidence()}


if __name__ == "__main__":
    main()
