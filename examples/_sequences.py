"""A toy task shared by the examples: regress the sum of a variable-length sequence with a GRU.

Not DeepTTE on purpose: each example shows one stfast capability inside a user's own model and loop.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence


def make_sequences(n: int, seed: int = 0, max_len: int = 60, features: int = 4):
    """n sequences [L_i, features] (float32, lengths 2..max_len) and targets [n]: the sum of their first feature."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_len + 1, (n,), generator=g)
    seqs = [torch.randn(int(t), features, generator=g) for t in lengths]
    target = torch.stack([s[:, 0].sum() for s in seqs])
    return seqs, target


class SeqRegressor(nn.Module):
    """A recurrent layer over a PackedSequence of the batch (list of [L_i, F]) → one value per sequence [B].

    ``rnn``: the recurrent module class, called as rnn(features, hidden, num_layers, batch_first=True):
    torch.nn.GRU (default), torch.nn.LSTM, or its drop-in stfast.nn.LSTM."""

    def __init__(self, features: int = 4, hidden: int = 32, num_layers: int = 1, rnn=nn.GRU):
        super().__init__()
        self.rnn = rnn(features, hidden, num_layers, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, seqs: list[torch.Tensor]) -> torch.Tensor:
        lengths = torch.tensor([len(s) for s in seqs])
        packed = pack_padded_sequence(pad_sequence(seqs, batch_first=True), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, h = self.rnn(packed)
        h = h[0] if isinstance(h, tuple) else h  # LSTM: (h_n, c_n)
        return self.head(h[-1]).squeeze(-1)


def run_gloo(worker, world_size: int = 2) -> None:
    """Start ``worker(rank, world_size)`` in ``world_size`` processes joined in a Gloo process group on
    this machine (what torchrun would set up), one torch thread each."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gloo_entry, args=(worker, world_size, port), nprocs=world_size)


def _gloo_entry(rank: int, worker, world_size: int, port: int) -> None:
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    finished = False
    try:
        worker(rank, world_size)
        finished = True
    finally:
        if finished:  # leave together: a rank tearing Gloo down while its peer still works can abort
            dist.barrier()
        dist.destroy_process_group()
