"""The global batches of a training epoch, as the trainer draws them (and benchmarks reproduce them)."""
from __future__ import annotations

import numpy as np

LENGTH_SORT_CHUNK = 100  # batches sorted by length inside chunks of this many (as the original)


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int,
                  members: np.ndarray | None = None) -> list[np.ndarray]:
    """Global batches of one epoch: a seeded shuffle, sorted by length inside chunks of
    LENGTH_SORT_CHUNK batches (less padding), batch order shuffled. The same on every rank; the last
    batch may be smaller. ``lengths`` [T] points per trip; returns arrays of trip indices. ``members``: the trip
    indices the epoch covers (default: all of ``lengths``)."""
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths)) if members is None else members[rng.permutation(len(members))]
    chunk = batch_size * LENGTH_SORT_CHUNK
    batches = []
    for s in range(0, len(perm), chunk):
        part = perm[s:s + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]
