"""Gradient noise scale (McCandlish et al. 2018, App. A) against problems whose B_simple is known."""
import math

import numpy as np
import pytest
import torch

from stfast.accum.noise import (
    GradientNoiseScale,
    UnitGradients,
    UnitNorms,
    noise_estimates,
    squared_norm,
)
from stfast.train.guards import BadStepGuard


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


def _units_for(g2: float) -> tuple[np.ndarray, float, int]:
    """Units whose two-batch |G|² estimate is exactly g2: two units of 1 trip, a step of 2 trips, |g_big|² = 1."""
    return np.array([2 * (2 - g2), 2.0, 2.0]), 1.0, 2


def test_g2_stderr_matches_the_spread_of_the_ema_over_replicas():
    rng = np.random.default_rng(7)
    ema, se = [], []
    for _ in range(2000):
        gns = GradientNoiseScale(decay=0.9)
        for _ in range(30):
            gns.update(*_units_for(rng.normal(2.0, 1.5)))
        ema.append(gns.g2)
        se.append(gns.g2_stderr)
    assert np.mean(ema) == pytest.approx(2.0, abs=0.03)
    assert np.mean(se) == pytest.approx(np.std(ema), rel=0.1)
    one = GradientNoiseScale()
    one.update(*_units_for(1.0))
    assert math.isnan(one.g2_stderr) and math.isnan(one.lower_confidence())


def test_lower_confidence_bound_does_not_jump_when_g2_nears_zero():
    """Two units of b = 16 trips per step (two ranks, k = 1) and B_simple = 8·b: the point estimate jumps
    past 10× the truth on some steps, the bound stays below 2.5× on every step and errs low."""
    rng = np.random.default_rng(0)
    d, b = 50, 16
    G = rng.normal(size=d)
    G /= np.linalg.norm(G)  # |G|² = 1
    sd = math.sqrt(8 * b / d)  # tr(Σ) = d·sd² = 8b
    truth = 8.0 * b
    gns = GradientNoiseScale()
    point, bound = [], []
    for _ in range(3000):
        per_trip = G + rng.normal(size=(2 * b, d)) * sd
        halves = (per_trip[:b].mean(0), per_trip[b:].mean(0))
        big = per_trip.mean(0)
        gns.update(np.array([sum(float(h @ h) for h in halves), 2 / b, 2.0]), float(big @ big), 2 * b)
        point.append(gns.value)
        bound.append(gns.lower_confidence())
    point, bound = np.array(point[10:]), np.array(bound[10:])
    assert np.nanmax(point) > 10 * truth
    assert not np.isnan(bound).any() and bound.max() < 2.5 * truth
    assert 0.4 * truth < np.median(bound) < truth < np.nanmedian(point) * 1.2



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_squared_norm_is_the_float64_sum_of_squares_and_flags_non_finite(dtype):
    """squared_norm (the guard's and the noise scale's |g|², one fused norm per tensor group) equals the
    float64 sum of squares of the concatenation; None entries are skipped; an inf or nan element makes
    it non-finite, which the bad-step guard reports — large finite float32 values do not."""
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(*shape, generator=g, dtype=dtype) * 10 ** e for shape, e in (((7, 3), 0), ((5,), 3), ((2, 2, 4), -2))]
    ref = float(torch.cat([t.reshape(-1) for t in ts]).double().square().sum())
    assert squared_norm([*ts, None]) == pytest.approx(ref, rel=1e-12 if dtype == torch.float64 else 1e-6)
    assert squared_norm([None]) == 0.0
    big = torch.full((4,), 3e38 if dtype == torch.float32 else 1e150, dtype=dtype)  # its square overflows float32
    assert math.isfinite(squared_norm([big])) and BadStepGuard.problem(1.0, squared_norm([big])) is None
    for bad in (math.inf, math.nan):
        broken = [t.clone() for t in ts]
        broken[1][2] = bad
        assert not math.isfinite(squared_norm(broken))
        assert BadStepGuard.problem(1.0, squared_norm(broken)) == "non-finite gradient"
    assert BadStepGuard.problem(math.nan, ref) == "non-finite loss"


def test_unit_norms_are_the_changes_of_the_accumulating_gradient():
    """Each unit's |g_u|² is |Δ.grad|²·(n_total/n_u)², per tensor, in float64: for three micro-steps, one
    parameter getting its first gradient in the second, one never (unused); ``last`` only skips the copy."""
    torch.manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))]
    steps = [{0: torch.randn(6, 4)}, {0: torch.randn(6, 4), 1: torch.randn(3)}, {0: torch.randn(6, 4), 1: torch.randn(3)}]
    sizes, n_total = [5, 7, 4], 16
    ug = UnitGradients(ps)
    ug.begin()
    for j, (inc, n) in enumerate(zip(steps, sizes)):
        for i, g in inc.items():  # what a backward accumulates into .grad
            ps[i].grad = g.clone() if ps[i].grad is None else ps[i].grad + g
        ug.after_micro_step(n, n_total, last=j == len(steps) - 1)
    want = [sum(float(g.double().square().sum()) for g in inc.values()) * (n_total / n) ** 2
            for inc, n in zip(steps, sizes)]
    ref = UnitNorms()
    for w, n in zip(want, sizes):
        ref.add(w, n)
    np.testing.assert_allclose(ug.units.as_array(), ref.as_array(), rtol=1e-6)
    assert ug.units.as_array()[0] > 0
