"""Gradient noise scale (McCandlish et al. 2018, App. A) against problems whose B_simple is known."""
import math

import numpy as np
import pytest
import torch

from stfast.accum.noise import (
    ADAM_WARMUP_STEPS,
    GradientNoiseScale,
    UnitGradients,
    UnitNorms,
    adam_preconditioner,
    noise_estimates,
    noise_kind,
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


def _adam_after(steps: int, amsgrad: bool = False, cls=torch.optim.Adam, seed: int = 4):
    """An embedding of 6 rows (rows 4, 5 never looked up: v = 0 there), a linear layer and a parameter
    outside the loss (no gradient, no Adam state), after ``steps`` Adam steps on random inputs."""
    torch.manual_seed(seed)
    emb, lin, unused = torch.nn.Embedding(6, 3), torch.nn.Linear(3, 2), torch.nn.Parameter(torch.randn(4))
    params = [emb.weight, lin.weight, lin.bias, unused]
    opt = cls(params, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, amsgrad=amsgrad)
    for _ in range(steps):
        opt.zero_grad()
        lin(emb(torch.randint(0, 4, (9,)))).square().sum().backward()
        opt.step()
    return opt, params


@pytest.mark.parametrize("cls,amsgrad", [(torch.optim.Adam, False), (torch.optim.Adam, True), (torch.optim.AdamW, False)])
def test_adam_preconditioner_is_one_over_sqrt_vhat_plus_eps_masked_where_v_is_zero(cls, amsgrad):
    steps = ADAM_WARMUP_STEPS + 2
    opt, params = _adam_after(steps, amsgrad, cls)
    assert adam_preconditioner(_adam_after(ADAM_WARMUP_STEPS - 1, amsgrad, cls)[0], params) is None  # warming up
    pre = adam_preconditioner(opt, params)
    assert pre[3] is None  # never had a gradient: left out
    for p, w in zip(params[:3], pre[:3]):
        st = opt.state[p]
        v = (st["max_exp_avg_sq"] if amsgrad else st["exp_avg_sq"]).double() / (1 - 0.95 ** steps)
        want = torch.where(v > 0, 1 / (v.sqrt() + 1e-6), 0.0)
        torch.testing.assert_close(w.double(), want, rtol=1e-5, atol=0)
    assert (pre[0][4:] == 0).all() and (pre[0][:4] > 0).all()  # unseen embedding rows masked, seen ones not
    # the optimizer state is read, not changed
    before = {id(p): opt.state[p]["exp_avg_sq"].clone() for p in params[:3]}
    adam_preconditioner(opt, params)
    assert all(torch.equal(before[id(p)], opt.state[p]["exp_avg_sq"]) for p in params[:3])


def test_weighted_squared_norm_leaves_out_unweighted_tensors():
    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g), None, torch.randn(2, generator=g)]
    ws = [torch.rand(3, 4, generator=g), None, torch.rand(7, generator=g), torch.rand(2, generator=g)]
    want = float((ts[0].double() * ws[0]).square().sum() + (ts[3].double() * ws[3]).square().sum())
    assert squared_norm(ts, ws) == pytest.approx(want, rel=1e-6)
    assert squared_norm(ts, [None] * 4) == 0.0
    with pytest.raises(ValueError):
        squared_norm(ts, ws[:2])  # one weight per tensor


def _gaussian_step(rng, G, s, n):
    """Mean of n per-trip gradients G + ε, ε ~ N(0, diag(s²)) [d]."""
    return torch.as_tensor((G + rng.normal(size=(n, len(G))) * s).mean(0))


def test_preconditioned_units_give_tr_p_sigma_p_over_p_g_squared():
    """Per-trip gradients G + ε (Σ = diag(s²)) accumulated over k micro-steps and a fixed P: B_adam →
    Σ p²s² / Σ p²G², which differs from B_simple = Σ s² / Σ G² by a factor > 3 here (the same draws without
    a preconditioner)."""
    d, k, b = 12, 4, 6
    G = np.random.default_rng(2).normal(size=d)
    s = np.where(np.arange(d) < 6, 0.3, 3.0)
    pw = np.where(np.arange(d) < 6, 2.0, 0.2)  # Adam damps the noisy elements
    truth = float((pw ** 2 * s ** 2).sum() / (pw ** 2 * G ** 2).sum())
    plain = float((s ** 2).sum() / (G ** 2).sum())
    assert plain > 3 * truth
    for P, want in (([torch.as_tensor(pw)], truth), (None, plain)):
        rng = np.random.default_rng(2)
        w = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
        ug, gns = UnitGradients([w]), GradientNoiseScale(decay=0.998)
        for _ in range(3000):
            w.grad = None
            ug.begin(P)
            for j in range(k):
                g = _gaussian_step(rng, G, s, b) / k  # this unit's share of the step's mean gradient
                w.grad = g.clone() if w.grad is None else w.grad + g
                ug.after_micro_step(b, k * b, last=j == k - 1)
            gns.update(ug.units.as_array(), ug.norm([w.grad]), k * b)
        assert gns.value == pytest.approx(want, rel=0.1)


@pytest.mark.parametrize("refresh", [False, True])
def test_one_process_pairs_consecutive_steps_with_unequal_sizes(refresh):
    """The differenced estimator: each step's gradient with the previous step's (sizes 8 and 3 alternate, as
    an epoch's short last batch would) converges to the truth, plain and preconditioned, whether the
    preconditioner stays or is a new (equal) list every step; its big-batch
    norm is that of the trip-weighted mean exactly; a forgotten previous step starts a new pair."""
    d = 10
    rng0 = np.random.default_rng(3)
    G, s = rng0.normal(size=d), rng0.uniform(0.5, 2.0, size=d)
    pw = rng0.uniform(0.2, 2.0, size=d)
    for P, want in ((pw, float((pw ** 2 * s ** 2).sum() / (pw ** 2 * G ** 2).sum())),
                    (None, float((s ** 2).sum() / (G ** 2).sum()))):
        rng = np.random.default_rng(4)
        w = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
        ug, gns = UnitGradients([w]), GradientNoiseScale(decay=0.998)
        fixed = None if P is None else [torch.as_tensor(P)]
        ug.begin(fixed)
        assert ug.pair_with_previous(8) is None  # no gradient yet: nothing to pair, and nothing kept
        prev = None
        for i in range(4000):
            n = 8 if i % 2 else 3
            ug.begin([torch.as_tensor(P)] if refresh and P is not None else fixed)
            w.grad = _gaussian_step(rng, G, s, n)
            out = ug.pair_with_previous(n)
            if i == 0:
                assert out is None  # the first of a pair
            else:
                units, big, total = out
                assert total == 11 and units[2] == 2 and units[1] == pytest.approx(1 / 8 + 1 / 3)
                if i < 3:
                    mean = (w.grad * n + prev[0] * prev[1]) / total
                    assert big == pytest.approx(ug.norm([mean]), rel=1e-9)
                gns.update(units, big, total)
            prev = (w.grad.clone(), n)
        assert gns.value == pytest.approx(want, rel=0.1)
    ug.forget_previous()
    assert ug.pair_with_previous(8) is None


def test_noise_kind_defaults_to_adam_under_adam_and_refuses_adam_without_it():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert noise_kind(None, torch.optim.Adam(p)) == "adam" == noise_kind(None, torch.optim.AdamW(p))
    assert noise_kind(None, torch.optim.SGD(p, lr=0.1)) == "plain" == noise_kind(None, None)
    assert noise_kind("plain", torch.optim.Adam(p)) == "plain"
    with pytest.raises(ValueError, match="--noise-scale adam needs an Adam"):
        noise_kind("adam", torch.optim.SGD(p, lr=0.1))
    with pytest.raises(ValueError, match="--noise-scale must be adam or plain"):
        noise_kind("fisher", torch.optim.Adam(p))
