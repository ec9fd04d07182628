"""Property tests (hypothesis) of the geo-conv ops and the slicer's partitioners on the CPU: arbitrary,
mostly invalid, CSR offsets, lengths, shapes, world sizes and cost models. The only outcomes allowed are a
correct result (checked against a plain-Python / plain-PyTorch reference or the partitioner's contract)
or ValueError / RuntimeError; a crash (a signal) kills pytest, which fails the run. Which inputs are
valid is decided here, independently of the code under test, so a wrong acceptance fails too.

Deterministic for CI: derandomized, bounded example counts, no deadline, no example database.
(LSTM properties live in tests/test_lstm_properties.py.)
"""
from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch

if os.environ.get("CI") == "true":  # CI installs the test extra: a missing hypothesis must fail there
    import hypothesis
else:
    hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stfast import _slicer
from stfast.ops import geo_conv_packed, geo_conv_padded, geo_conv_reference
from stfast.parallel.slicer import LinearCostModel, partition, predicted_times

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=250,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ERRORS = (ValueError, RuntimeError)
EXTREME_INTS = [2**62, -2**63, 2**63 - 1, -1]


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # what the CPU kernels take (issue 44)


def tol(dtype):
    if dtype in (torch.float16, torch.bfloat16):  # compared with the float64 reference of the same inputs
        return {"rtol": 3e-2, "atol": 3e-2}
    return {"rtol": 1e-9, "atol": 1e-9} if dtype == torch.float64 else {"rtol": 2e-4, "atol": 2e-4}


def upcast(args):
    """16-bit floating arguments widened to float64 (the reference of a 16-bit call); others as they are."""
    return tuple(a.double() if a.dtype in (torch.float16, torch.bfloat16) else a for a in args)


# ----------------------------------------------------------------- geo-conv

def csr_valid(offsets: list[int], n: int, k: int) -> bool:
    """The op's contract for offsets, written independently: 0 = o_0 ≤ … ≤ o_B = N, every trip ≥ k points."""
    return (len(offsets) >= 1 and k >= 1 and offsets[0] == 0 and offsets[-1] == n
            and all(b - a >= k for a, b in itertools.pairwise(offsets)))


@st.composite
def offsets_for(draw, k: int):
    """(offsets, N): a valid CSR for kernel k, a slightly broken one, or arbitrary integers."""
    kind = draw(st.sampled_from(["valid", "valid", "valid", "broken", "arbitrary"]))
    if kind == "arbitrary":
        offsets = draw(st.lists(st.one_of(st.integers(-3, 40), st.sampled_from(EXTREME_INTS)), max_size=6))
        return offsets, draw(st.integers(0, 40))
    lengths = draw(st.lists(st.integers(max(k, 0), max(k, 0) + 7), max_size=5))
    offsets = [0, *itertools.accumulate(lengths)]
    n = offsets[-1]
    if kind == "broken":
        how = draw(st.sampled_from(["N+1", "N-1", "first", "swap", "short", "past_N", "drop_last"]))
        if how == "N+1":
            n += 1
        elif how == "N-1":
            n -= 1
        elif how == "first":
            offsets[0] += draw(st.sampled_from([1, -1, 4000]))
        elif how == "swap" and len(offsets) >= 3:
            offsets[1], offsets[2] = offsets[2], offsets[1]
        elif how == "short" and len(offsets) >= 2:
            offsets[1] = max(offsets[1] - draw(st.integers(1, 3)), 0)
        elif how == "past_N":
            offsets[-1] += 3995
        elif how == "drop_last" and len(offsets) >= 2:
            offsets.pop()
    return offsets, max(n, 0)


@st.composite
def geo_inputs(draw):
    """Forward arguments and whether the op must accept them."""
    k = draw(st.sampled_from([1, 2, 3, 3, 4, 0]))
    F_in, H, C = draw(st.integers(0, 5)), draw(st.sampled_from([0, 1, 3, 16])), draw(st.sampled_from([0, 2, 5, 32]))
    offsets, n = draw(offsets_for(k))
    dtype = draw(st.sampled_from([torch.float64, torch.float64, torch.float32]))
    off_kind = draw(st.sampled_from(["int64"] * 12 + ["int32", "float", "2d"]))
    broken_arg = draw(st.sampled_from([None] * 24 + ["local_dist", "proj_bias", "conv_bias", "proj_weight",
                                                      "conv_weight", "points", "dtype", "half"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    B = len(offsets) - 1
    n_out = n - B * (k - 1)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    shapes = {"points": (n, F_in), "local_dist": (max(n_out, 0),), "proj_weight": (H, F_in), "proj_bias": (H,),
              "conv_weight": (C, H, k), "conv_bias": (C,)}
    if broken_arg in shapes:
        s = list(shapes[broken_arg])
        if broken_arg == "points":
            s = [*s, 2]  # (N, F, 2)
        else:
            s[-1] += 1
        shapes[broken_arg] = tuple(s)
    t = {name: r(*shape) for name, shape in shapes.items()}
    if broken_arg == "dtype":
        t["conv_weight"] = t["conv_weight"].to(torch.float32 if dtype == torch.float64 else torch.float64)
    if broken_arg == "half":  # valid: the CPU kernels take float16 / bfloat16 too (float32 accumulation)
        t = {name: v.half() for name, v in t.items()}
    off = torch.tensor(offsets, dtype=torch.int64)
    off = {"int64": off, "int32": off.to(torch.int32), "float": off.double(), "2d": off[None]}[off_kind]
    return t["points"], off, t["local_dist"], t["proj_weight"], t["proj_bias"], t["conv_weight"], t["conv_bias"]


def sizes_valid(x, off, w1, w2, others) -> tuple[bool, int]:
    """(valid, N_out) of the arguments every geo-conv op shares: points (N, F) of a dtype of FLOATS, offsets a valid CSR
    for N and k, proj_weight (H, F), conv_weight (C, H, k), every float tensor of points' dtype."""
    if x.dim() != 2 or x.dtype not in FLOATS or off.dtype != torch.int64 or off.dim() != 1:
        return False, 0
    if any(t.dtype != x.dtype for t in (w1, w2, *others)):
        return False, 0
    if w1.dim() != 2 or w1.shape[1] != x.shape[1] or w2.dim() != 3 or w2.shape[1] != w1.shape[0]:
        return False, 0
    n, k = x.shape[0], w2.shape[2]
    return csr_valid(off.tolist(), n, k), n - (off.shape[0] - 1) * (k - 1)


def forward_valid(x, off, ld, w1, b1, w2, b2) -> bool:
    ok, n_out = sizes_valid(x, off, w1, w2, (ld, b1, b2))
    return ok and b1.shape == (w1.shape[0],) and b2.shape == (w2.shape[0],) and ld.shape == (n_out,)


@FUZZ
@given(geo_inputs())
def test_geo_conv_forward_fuzz(args):
    """Raw forward op and the packed wrapper: the reference's result when valid, else a ValueError/RuntimeError."""
    valid = forward_valid(*args)
    calls = [lambda: torch.ops.stfast.geo_conv_forward(*args)[0], lambda: geo_conv_packed(*args)]
    for call in calls:
        if valid:
            torch.testing.assert_close(call().to(torch.float64), geo_conv_reference(*upcast(args)).to(torch.float64),
                                       **tol(args[0].dtype))
        else:
            with pytest.raises(ERRORS):
                call()


def backward_reference(go, x, offsets, h, y, w1, w2):
    """Plain-PyTorch backward of the geo-conv as a function of the backward op's own inputs (y = the forward's
    out, h = tanh of the projection): dz = dy·elu'(z), then the convolution's and projection's transposes."""
    C, H, k = w2.shape
    yc = y[:, :C]
    gz = go[:, :C] * torch.where(yc > 0, torch.ones_like(yc), yc + 1)
    gh, gw2, o = torch.zeros_like(h), torch.zeros_like(w2), 0
    for n0, n1 in itertools.pairwise(offsets.tolist()):
        lo = n1 - n0 - k + 1
        z = gz[o:o + lo]
        for t in range(k):
            gh[n0 + t:n0 + t + lo] += z @ w2[:, :, t]
            gw2[:, :, t] += z.T @ h[n0 + t:n0 + t + lo]
        o += lo
    gu = gh * (1 - h * h)
    return gu @ w1, gu.T @ x, gu.sum(0), gw2, gz.sum(0)


@st.composite
def geo_backward_inputs(draw):
    """Backward arguments: random hidden / out / grad_out (the op is a function of them), sized from the
    forward arguments' N, H, C and N_out with an occasional error."""
    x, off, _ld, w1, _b1, w2, _b2 = draw(geo_inputs())
    n = x.shape[0]
    H, C = w1.shape[0] if w1.dim() == 2 else 1, w2.shape[0] if w2.dim() == 3 else 1
    k = w2.shape[2] if w2.dim() == 3 else 1
    n_out = max(n - (off.shape[-1] - 1) * (k - 1), 0)
    shapes = {"hidden": [n, H], "out": [n_out, C + 1], "grad_out": [n_out, C + 1]}
    which = draw(st.sampled_from([None] * 6 + ["hidden", "out", "grad_out", "grad_dtype"]))
    if which in shapes:
        shapes[which][draw(st.integers(0, 1))] += 1
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    hidden, out, go = (torch.randn(*shapes[name], generator=g, dtype=torch.float64).to(x.dtype).tanh()
                       for name in ("hidden", "out", "grad_out"))
    if which == "grad_dtype":
        go = go.to(torch.float32 if x.dtype == torch.float64 else torch.float64)
    return go, x, off, hidden, out, w1, w2


def backward_valid(go, x, off, h, y, w1, w2) -> bool:
    ok, n_out = sizes_valid(x, off, w1, w2, (go, h, y))
    return (ok and h.shape == (x.shape[0], w1.shape[0]) and y.shape == (n_out, w2.shape[0] + 1)
            and go.shape == y.shape)


@FUZZ
@given(geo_backward_inputs())
def test_geo_conv_backward_fuzz(args):
    """Raw backward op: the plain-PyTorch backward when valid, else a ValueError/RuntimeError."""
    if backward_valid(*args):
        got = torch.ops.stfast.geo_conv_backward(*args)
        for a, b in zip(got, backward_reference(*args), strict=True):
            torch.testing.assert_close(a, b, **tol(args[1].dtype))
    else:
        with pytest.raises(ERRORS):
            torch.ops.stfast.geo_conv_backward(*args)


@st.composite
def padded_inputs(draw):
    B, L, k = draw(st.integers(0, 4)), draw(st.integers(0, 9)), draw(st.sampled_from([1, 3, 3, 4]))
    lo = max(L - k + 1, 0)
    lengths = draw(st.one_of(st.none(), st.lists(st.integers(-2, L + 2), min_size=max(B - 1, 0), max_size=B + 1)))
    ldtype = draw(st.sampled_from([torch.int64, torch.int64, torch.int32, torch.float32]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    args = (r(B, L, 3), r(B, lo), r(5, 3), r(5), r(4, 5, k), r(4))
    lengths_t = None if lengths is None else torch.tensor(lengths, dtype=ldtype)
    valid = L >= k and (lengths is None or (len(lengths) == B and not ldtype.is_floating_point
                                            and all(k <= n <= L for n in lengths)))
    return args, lengths_t, valid


@FUZZ
@given(padded_inputs())
def test_geo_conv_padded_fuzz(case):
    """The padded wrapper with arbitrary lengths: per-trip reference rows (zeros past each trip) when valid."""
    (x, ld, w1, b1, w2, b2), lengths, valid = case
    if not valid:
        with pytest.raises(ERRORS):
            geo_conv_padded(x, ld, w1, b1, w2, b2, lengths=lengths)
        return
    B, L, _ = x.shape
    k = w2.shape[2]
    out = geo_conv_padded(x, ld, w1, b1, w2, b2, lengths=lengths)
    expect = torch.zeros(B, L - k + 1, w2.shape[0] + 1, dtype=x.dtype)
    for b in range(B):
        n = L if lengths is None else int(lengths[b])
        expect[b, :n - k + 1] = geo_conv_reference(x[b, :n], torch.tensor([0, n]), ld[b, :n - k + 1], w1, b1, w2, b2)
    torch.testing.assert_close(out, expect, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------- slicer partitioners

MAX_W = _slicer.MAX_WORLD_SIZE
BAD_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 1e308, -0.0, 5e-324]
good_lengths = st.lists(st.one_of(st.integers(0, 600).map(float), st.floats(0, 1e4), st.just(-0.0)), max_size=40)


@st.composite
def one_bad(draw, good, bad_values):
    """``good`` with one entry replaced by (or, when empty, set to) one of ``bad_values``."""
    values = list(draw(good))
    bad = draw(st.sampled_from(bad_values))
    if values:
        values[draw(st.integers(0, len(values) - 1))] = bad
    else:
        values = [bad]
    return values


# Mostly valid, so that correct results are checked often; each invalid kind still appears in every run.
lengths_st = st.one_of(good_lengths, good_lengths, one_bad(good_lengths, BAD_FLOATS))
world_st = st.one_of(st.integers(1, 48), st.integers(1, 48), st.integers(1, 48), st.integers(1, 48), st.integers(-3, 0),
                     st.sampled_from([MAX_W + 1, 2**31, 2**62, -2**63]))
good_coefs = st.lists(st.one_of(st.floats(0, 10), st.sampled_from([0.0, 1e-12])), min_size=5, max_size=5)
model_st = st.one_of(good_coefs, good_coefs, good_coefs, one_bad(good_coefs, [1e300, math.nan, math.inf, -1.0]),
                     st.lists(st.floats(0, 10), min_size=4, max_size=6)).map(tuple)
coef_st = st.one_of(st.floats(0, 10), st.sampled_from([0.0, 1e-12, 1e300, math.nan, math.inf, -1.0]))


def model_of(m):
    a, b, c, d, e = m
    return lambda n, s, lmax: 0.0 if n == 0 else a + b * n + c * s + d * n * lmax + e * lmax


def slicer_valid(lengths, w, m) -> bool | None:
    """The partitioners' contract for their inputs; None where float rounding makes the 1e300 cap ambiguous."""
    if not (1 <= w <= MAX_W and len(m) == 5 and all(math.isfinite(c) and c >= 0 for c in m)):
        return False
    if not all(math.isfinite(v) and v >= 0 for v in lengths):
        return False
    s = 0.0
    for v in lengths:
        s += v
    total = model_of(m)(len(lengths), s, max(lengths, default=0.0))
    if math.isfinite(total) and abs(total - 1e300) <= 1e-9 * 1e300:
        return None
    return total <= 1e300


def costs(lengths, asg, w, m):
    """Python reference of shard_costs."""
    f = model_of(m)
    out = []
    for s in range(w):
        mine = [v for v, a in zip(lengths, asg) if a == s]
        total = 0.0
        for v in mine:
            total += v
        out.append(f(len(mine), total, max(mine, default=0.0)))
    return np.array(out)


def check_assignment(asg, lengths, w, nonempty=True):
    assert asg.dtype == np.int32 and asg.shape == (len(lengths),)
    assert ((asg >= 0) & (asg < w)).all()
    if nonempty and len(lengths) >= w:
        assert len(np.unique(asg)) == w  # every shard non-empty when B >= W


def sorted_strided_reference(lengths, w):
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    asg = np.empty(len(lengths), np.int32)
    for pos, i in enumerate(order):
        asg[i] = pos % w
    return asg


@settings(FUZZ, max_examples=300)
@given(lengths_st, world_st, model_st, st.integers(-5, 3000))
def test_slicer_partitioners_fuzz(lengths, w, m, max_iters):
    """Every native partitioner: a valid assignment meeting its contract, or ValueError / RuntimeError."""
    valid = slicer_valid(lengths, w, m)
    arr = np.array(lengths, dtype=np.float64)
    kk_valid = slicer_valid(lengths, w, (0, 0, 1, 0, 0))
    kk_valid = kk_valid and len(lengths) * w <= _slicer.MAX_KARMARKAR_KARP_CELLS
    sk_valid = slicer_valid(lengths, w, (0, 0, 1, 0, 0))
    calls = {
        "lpt": (lambda: _slicer.lpt(arr, w, m), valid),
        "contiguous": (lambda: _slicer.contiguous(arr, w, m), valid),
        "balanced": (lambda: _slicer.balanced(arr, w, m, max_iters), valid),
        "kk": (lambda: _slicer.karmarkar_karp(arr, w), kk_valid),
        "sorted": (lambda: _slicer.sorted_strided(arr, w), sk_valid),
    }
    results = {}
    for name, (call, ok) in calls.items():
        if ok is None:  # at the cost cap's rounding edge: either outcome, but never a crash
            try:
                call()
            except ERRORS:
                pass
            continue
        if not ok:
            with pytest.raises(ERRORS):
                call()
            continue
        results[name] = asg = call()
        check_assignment(asg, lengths, w)
    if "sorted" in results:
        np.testing.assert_array_equal(results["sorted"], sorted_strided_reference(lengths, w))
    if "contiguous" in results:  # runs of the (length, index) order: shard ids never decrease along it
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        assert (np.diff(results["contiguous"][order]) >= 0).all()
    if "balanced" in results and "lpt" in results and max_iters >= 0:
        # balanced refines the best of its starts (LPT among them): never worse than LPT
        worst = {name: costs(lengths, results[name], w, m).max(initial=0.0) for name in ("balanced", "lpt")}
        assert worst["balanced"] <= worst["lpt"] * (1 + 1e-9) + 1e-300


@st.composite
def assignments(draw):
    lengths = draw(lengths_st)
    w = draw(world_st)
    size = draw(st.sampled_from([len(lengths)] * 6 + [len(lengths) + 1, max(len(lengths) - 1, 0)]))
    hi = min(max(w, 1), 60)
    ids = st.lists(st.integers(0, hi - 1), min_size=size, max_size=size)
    asg = draw(st.one_of(ids, ids, ids, one_bad(ids, [-1, hi, 2**31 - 1, -2**31])))
    return lengths, np.array(asg, dtype=np.int32), w


@settings(FUZZ, max_examples=300)
@given(assignments(), model_st, st.integers(-5, 3000))
def test_slicer_shard_costs_and_refine_fuzz(case, m, max_iters):
    """shard_costs equals the Python reference; refine keeps ids valid, empties no shard and never raises
    the slowest shard's time; bad inputs raise ValueError / RuntimeError."""
    lengths, asg, w = case
    arr = np.array(lengths, dtype=np.float64)
    valid = slicer_valid(lengths, w, m)
    if valid is None:
        return
    valid = valid and len(asg) == len(lengths) and bool(((asg >= 0) & (asg < w)).all())
    if not valid:
        with pytest.raises(ERRORS):
            _slicer.shard_costs(arr, asg, w, m)
        with pytest.raises(ERRORS):
            _slicer.refine(arr, asg, w, m, max_iters)
        return
    t = _slicer.shard_costs(arr, asg, w, m)
    np.testing.assert_allclose(t, costs(lengths, asg, w, m), rtol=1e-12, atol=0)
    refined = _slicer.refine(arr, asg, w, m, max_iters)
    check_assignment(refined, lengths, w, nonempty=False)
    assert len(np.unique(refined)) >= len(np.unique(asg))  # never empties a shard
    before, after = t.max(initial=0.0), costs(lengths, refined, w, m).max(initial=0.0)
    assert after <= before * (1 + 1e-9) + 1e-300


@settings(FUZZ, max_examples=200)
@given(lengths_st, world_st, st.sampled_from(["balanced", "equal", "sorted", "lpt", "kk", "contiguous"]),
       st.tuples(*[coef_st] * 5))
def test_slicer_python_partition_fuzz(lengths, w, method, coef):
    """stfast.parallel.slicer.partition / predicted_times over the native calls: a valid partition whose
    predicted times match the reference, or a ValueError / RuntimeError."""
    try:
        cost = LinearCostModel(coef)
    except ValueError:
        assert not (all(math.isfinite(c) and c >= 0 for c in coef) and any(c > 0 for c in coef))
        cost = None
    m = cost.as_tuple if cost is not None else (0.0, 0.0, 1.0, 1.0, 0.0)
    sane = w >= 1 and all(math.isfinite(v) and v >= 0 for v in lengths)
    model = {"lpt": (0, 0, 1, 0, 0), "kk": (0, 0, 1, 0, 0), "sorted": (0, 0, 1, 0, 0)}.get(method, m)
    valid = sane if method == "equal" else (sane and slicer_valid(lengths, w, model))
    if method == "kk" and valid:
        valid = len(lengths) * w <= _slicer.MAX_KARMARKAR_KARP_CELLS
    if valid is None:
        return
    if not valid:
        with pytest.raises(ERRORS):
            partition(np.array(lengths), w, method, cost)
        return
    asg = partition(np.array(lengths), w, method, cost)
    check_assignment(asg, lengths, w)
    times_valid = slicer_valid(lengths, w, m)  # predicted_times runs the native shard_costs under ``cost``
    if times_valid:
        np.testing.assert_allclose(predicted_times(np.array(lengths), asg, w, cost), costs(lengths, asg, w, m),
                                   rtol=1e-12, atol=0)
    elif times_valid is False:
        with pytest.raises(ERRORS):
            predicted_times(np.array(lengths), asg, w, cost)


def test_slicer_world_size_cap():
    """The largest world size works without gigabytes of state; one more is a ValueError, not an allocation."""
    asg = _slicer.lpt(np.array([5.0, 3.0, 9.0]), MAX_W, (0.0, 0.0, 1.0, 0.0, 0.0))
    assert sorted(asg.tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="world_size must be in"):
        _slicer.sorted_strided(np.array([1.0]), MAX_W + 1)
