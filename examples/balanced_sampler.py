"""The load-balancing slicer in a hand-written data-parallel loop: BalancedBatchSampler as a DataLoader
``batch_sampler``, with the exact gradient weighting for unequal shards.

    python examples/balanced_sampler.py            # starts 2 Gloo processes on this machine

Sequences of 2 to 200 steps: an equal-count split would leave one rank waiting for the other's long
sequences. Every rank computes the same cost-balanced cut of each global batch (no communication); each
divides its shard's loss SUM by the GLOBAL batch size and gradients are summed, so the training equals
one process on the whole batches. The global batch size comes with each shard (``Shard.global_size``,
handed to the collate_fn by ``ShardDataset``), so it is right with any ``num_workers``: a loader runs
ahead of the loop, and its workers hold copies of the sampler. Rank 0 prints the shard sizes of the
first steps and the largest parameter difference against that single process.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sequences import SeqRegressor, make_sequences, run_gloo

from stfast.parallel.slicer import BalancedBatchSampler, ShardDataset

N, GLOBAL_BATCH = 96, 32
SEQS, TARGET = make_sequences(N, seed=3, max_len=200)


def collate(shard):
    """The shard's sequence indices as they are (a Shard: a list with ``global_size``; the default collate
    would make a tensor of them and drop the size); the loop gathers the sequences."""
    return shard


def train(rank: int, world: int) -> tuple[dict, list]:
    torch.manual_seed(0)
    model = SeqRegressor().double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    lengths = np.array([len(s) for s in SEQS])
    sampler = BalancedBatchSampler(lengths, GLOBAL_BATCH, world, rank, seed=0)
    loader = DataLoader(ShardDataset(range(N)), batch_sampler=sampler, collate_fn=collate)
    shard_sizes = []
    for idx in loader:
        opt.zero_grad(set_to_none=True)
        if idx:
            pred = model([SEQS[i].double() for i in idx])
            loss = (pred - TARGET[idx].double()).square().sum() / idx.global_size
            loss.backward()
        for p in model.parameters():  # sum over ranks (an empty shard contributes zeros)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if world > 1:
                dist.all_reduce(p.grad)
        opt.step()
        shard_sizes.append((len(idx), int(lengths[idx].sum())))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, shard_sizes


def worker(rank: int, world: int) -> None:
    params, sizes = train(rank, world)
    gathered = [None] * world
    dist.all_gather_object(gathered, sizes)
    if rank == 0:
        for step in range(2):
            print(f"step {step}: " + ", ".join(f"rank {r}: {g[step][0]} sequences / {g[step][1]} steps"
                                               for r, g in enumerate(gathered)))
        one, _ = train(0, 1)
        diff = max((params[n] - one[n]).abs().max().item() for n in one)
        print(f"2 ranks vs 1 process after {len(sizes)} steps: largest parameter difference {diff:.2e}")
        torch.save({"diff": diff, "sizes": gathered}, os.environ.get("STFAST_EXAMPLE_OUT", os.devnull))


if __name__ == "__main__":
    run_gloo(worker, 2)
