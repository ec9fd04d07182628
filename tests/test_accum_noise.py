"""Gradient noise scale (McCandlish et al. 2018, App. A) against problems whose B_simple is known."""
import math

import numpy as np
import pytest
import torch

from stfast.accum.noise import GradientNoiseScale, UnitGradients, noise_estimates


def test_two_batch_estimates_are_unbiased_for_gaussian_gradients():
    # per-trip gradients g_i = G + ε_i, ε ~ N(0, diag(s²)): |G|² and tr(Σ) = Σ s² are known exactly
    rng = np.random.default_rng(0)
    d = 20
    G = rng.normal(size=d)
    s = rng.uniform(0.5, 3.0, size=d)
    true_g2, true_trace = float(G @ G), float((s ** 2).sum())
    b_small, n_small = 4, 8
    g2s, trs = [], []
    for _ in range(4000):
        per_trip = G + rng.normal(size=(b_small * n_small, d)) * s
        smalls = per_trip.reshape(n_small, b_small, d).mean(1)
        big = per_trip.mean(0)
        g2, tr = noise_estimates(float((smalls ** 2).sum(1).mean()), b_small, float(big @ big), b_small * n_small)
        g2s.append(g2)
        trs.append(tr)
    assert np.mean(g2s) == pytest.approx(true_g2, rel=0.03)
    assert np.mean(trs) == pytest.approx(true_trace, rel=0.03)


def test_unequal_units_use_the_harmonic_mean_size():
    # units of 1, 3 and 12 trips (a slicer's unequal shards): B_simple still converges to the truth
    rng = np.random.default_rng(1)
    d = 10
    G = rng.normal(size=d) * 0.5
    s = np.full(d, 2.0)
    truth = float((s ** 2).sum() / (G @ G))
    sizes = [1, 3, 12]
    gns = GradientNoiseScale(decay=0.999)
    for _ in range(6000):
        per_trip = G + rng.normal(size=(sum(sizes), d)) * s
        splits = np.split(per_trip, np.cumsum(sizes)[:-1])
        units = np.array([sum(float((u.mean(0) ** 2).sum()) for u in splits), sum(1 / b for b in sizes), len(sizes)])
        big = per_trip.mean(0)
        assert gns.update(units, float(big @ big), sum(sizes))
    assert gns.value == pytest.approx(truth, rel=0.1)
    # a naive arithmetic-mean unit size would be far off: check the test can tell them apart
    naive_small = float(np.mean(sizes))
    assert abs(naive_small - len(sizes) / sum(1 / b for b in sizes)) > 2


def test_micro_step_gradients_of_linear_regression_give_the_closed_form_noise_scale():
    # loss ½(w·x − y)², x ~ N(0, I_d), y = w*·x + n, n ~ N(0, σ²), at w = w* + δ:
    # G = δ, Σ = (|δ|² + σ²) I + δδᵀ  ⇒  B_simple = (d(|δ|² + σ²) + |δ|²) / |δ|²
    torch.manual_seed(0)
    d, sigma, k, b = 8, 0.5, 8, 8
    w_star = torch.randn(d, dtype=torch.float64)
    delta = 0.7 * torch.randn(d, dtype=torch.float64)
    w = torch.nn.Parameter(w_star + delta)
    dd = float(delta @ delta)
    truth = (d * (dd + sigma ** 2) + dd) / dd
    ug = UnitGradients([w])
    gns = GradientNoiseScale(decay=0.995)
    for _ in range(800):
        w.grad = None
        ug.begin()
        n_total = k * b
        xs = torch.randn(k, b, d, dtype=torch.float64)
        ys = xs @ w_star + sigma * torch.randn(k, b, dtype=torch.float64)
        for x, y in zip(xs, ys):  # k micro-steps accumulate into w.grad; each loss is its sum / n_total
            (0.5 * (x @ w - y).square().sum() / n_total).backward()
            ug.after_micro_step(b, n_total)
        gns.update(ug.units.as_array(), float(w.grad.square().sum()), n_total)
    assert gns.value == pytest.approx(truth, rel=0.1)


def test_single_unit_and_bad_sizes():
    gns = GradientNoiseScale()
    assert not gns.update(np.array([1.0, 1 / 8, 1.0]), 0.5, 8)
    assert math.isnan(gns.value)
    with pytest.raises(ValueError, match="b_small"):
        noise_estimates(1.0, 8, 1.0, 8)
    with pytest.raises(ValueError, match="decay"):
        GradientNoiseScale(decay=1.0)


def test_non_positive_g2_estimate_is_unknown_not_infinite():
    """When the |G|² estimate (EMA) is ≤ 0 — the estimator's noise exceeding the signal, common with two
    units per step — the noise scale is unknown (nan), not infinite; a later positive estimate counts."""
    gns = GradientNoiseScale(decay=0.5)
    # two units of 16 trips with mean |g_u|² = 10 and |g_big|² = 1 over 32 trips: |G|² = (32 − 160)/16 < 0
    assert gns.update(np.array([20.0, 2 / 16, 2.0]), 1.0, 32)
    assert gns.g2 < 0 < gns.trace
    assert math.isnan(gns.value)
    for _ in range(6):  # consistent units: |g_u|² = 1.5, |g_big|² = 1.25 -> |G|² = 1, tr(Σ) = 8
        gns.update(np.array([3.0, 2 / 16, 2.0]), 1.25, 32)
    assert gns.g2 > 0 and math.isfinite(gns.value) and gns.value > 0
