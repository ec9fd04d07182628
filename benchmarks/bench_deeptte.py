"""Microbenchmark of the plain-PyTorch DeepTTE training step (the baseline later fused kernels
are measured against, side by side in one run). Run: pytest benchmarks/ --benchmark-only"""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import random_trips  # noqa: E402

from stfast.data.dataset import DriverVocab, NormStats, TripDataset  # noqa: E402
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts  # noqa: E402


@pytest.mark.parametrize("batch_size", [64, 256])
def test_reference_train_step(benchmark, batch_size):
    trips = random_trips(batch_size, seed=0, min_len=15, max_len=80)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(trips))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    b = TripDataset(trips, vocab).batch(np.arange(batch_size))

    def step():
        out = model(b)
        p = loss_parts(model, out, b)
        loss = combine_loss(p, 0.3, p.n_trips, p.n_local)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    loss = benchmark(step)
    assert np.isfinite(loss)
    benchmark.extra_info["trips_per_step"] = batch_size
