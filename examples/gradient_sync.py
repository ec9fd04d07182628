"""stfast's GradientSync in a hand-written data-parallel loop, with unequal shards per rank.

    python examples/gradient_sync.py            # starts 2 Gloo processes on this machine

Each rank's loss is its shard's SUM divided by the GLOBAL batch size, and GradientSync sums the
gradients over the ranks in buckets while the backward runs, so the step equals one process on the whole
batch even when the shards differ in size (here 11 and 5 sequences). Rank 0 checks that against a
single-process run and prints the largest parameter difference.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sequences import SeqRegressor, make_sequences, run_gloo

from stfast.parallel.comm import GradientSync, TorchCommunicator

STEPS, BATCH, SHARD0 = 5, 16, 11  # rank 0 takes 11 sequences of each global batch, rank 1 the other 5


def batches(seed=1):
    seqs, target = make_sequences(BATCH * STEPS, seed=seed)
    return [(seqs[s * BATCH:(s + 1) * BATCH], target[s * BATCH:(s + 1) * BATCH]) for s in range(STEPS)]


def train(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = SeqRegressor().double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sync = GradientSync(model.parameters(), TorchCommunicator()) if world > 1 else None
    for seqs, target in batches():
        lo, hi = (0, BATCH) if world == 1 else ((0, SHARD0) if rank == 0 else (SHARD0, BATCH))
        opt.zero_grad(set_to_none=True)
        pred = model([s.double() for s in seqs[lo:hi]])
        loss = (pred - target[lo:hi].double()).square().sum() / BATCH  # divided by the GLOBAL batch
        loss.backward()  # GradientSync's hooks start each bucket's all-reduce as soon as it is ready
        if sync is not None:
            sync.finish()  # wait for the buckets; p.grad now holds the sum over ranks
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def worker(rank: int, world: int) -> None:
    params = train(rank, world)
    if rank == 0:
        one = train(0, 1)
        diff = max((params[n] - one[n]).abs().max().item() for n in one)
        print(f"2 ranks (shards {SHARD0} + {BATCH - SHARD0}) vs 1 process, {STEPS} Adam steps: "
              f"largest parameter difference {diff:.2e}")
        torch.save(diff, os.environ.get("STFAST_EXAMPLE_OUT", os.devnull))


if __name__ == "__main__":
    run_gloo(worker, 2)
