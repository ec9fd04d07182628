"""The fused geo-convolution op (stfast.ops.geo_conv, stfast.nn.GeoConv) against the plain-PyTorch
reference (stfast.models.deeptte.GeoConv): outputs and every gradient, on every device.

Inputs are fresh random numbers each run (the seed is in every failure message); never zeros. Every
test that takes ``device`` has a ``cuda`` variant, skipped without a GPU, so ``pytest -k cuda`` on a GPU
machine runs the CUDA side of each (issue 24's rows 1-4: test_padded_lengths_checked_on_host,
test_invalid_offsets_same_error_on_every_device, test_backward_rejects_offsets_that_miss_points,
test_degenerate_sizes). CUDA float32 references run with TF32 off (fixture below), so CUDA tolerances
mean what the CPU ones mean."""
import pytest
import torch
import torch.nn.functional as F
from _accuracy import assert_flash_rule, fresh_seed

import stfast
from stfast.models.deeptte import DeepTTEConfig
from stfast.models.deeptte import GeoConv as ReferenceGeoConv
from stfast.nn import GeoConv
from stfast.ops import (
    geo_conv_packed,
    geo_conv_padded,
    geo_conv_reference,
    output_offsets,
)

HAS_CUDA = torch.cuda.is_available() and stfast.build_info()["cuda"]
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of stfast")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]


@pytest.fixture(autouse=True)
def _no_tf32():
    """cuDNN runs float32 convolutions in TF32 by default (10-bit mantissa): the float32 reference's own
    error would then be ~1000x the CPU's and the flash rule's bound close to vacuous. Legacy flag through
    torch's context manager (mixing it with the fp32_precision API makes the legacy getter raise)."""
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                     allow_tf32=False):
        yield
CFG = DeepTTEConfig(n_drivers=4)
K = CFG.kernel_size
LENGTH_CASES = {
    "mixed": [5, 17, 3, 40, 9],
    "L_eq_k": [K, K, K],
    "B1": [23],
    "one_long": [3, 4, 3, 300, 5, 3],
}


def make_inputs(lengths, dtype=torch.float64, device="cpu", seed=None, requires_grad=True, F_in=4, H=16, C=32, k=K):
    """Random packed inputs: points (N, F_in), offsets (CPU), local_dist (N − B(k − 1),), weights (H, C, k)."""
    seed = fresh_seed() if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    n_out = n - len(lengths) * (k - 1)
    offsets = torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int64)

    def r(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(requires_grad)

    # offsets stay on the host: the ops read them there on every device
    args = (r(n, F_in), offsets, r(n_out), r(H, F_in, scale=0.5), r(H, scale=0.3), r(C, H, k, scale=0.3),
            r(C, scale=0.3))
    return args, seed


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def grads(out, inputs, seed):
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)
    diff = [t for t in inputs if t.requires_grad]
    return torch.autograd.grad((out * w).sum(), diff)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_packed_float64_matches_reference(case, device):
    args, seed = make_inputs(LENGTH_CASES[case], device=device)
    out = geo_conv_packed(*args)
    ref = geo_conv_reference(*args)
    assert out.shape == ref.shape == (sum(LENGTH_CASES[case]) - len(LENGTH_CASES[case]) * (K - 1), 33)
    assert rel_err(out, ref) < 1e-10, seed
    for a, b in zip(grads(out, args, seed), grads(ref, args, seed)):
        assert rel_err(a, b) < 1e-10, seed


def _flash_rule(lengths, dtype, device):
    """flash-attention's rule (tests/_accuracy.py): fused(dtype) against the reference(f64), relative to the
    reference(dtype)'s own error."""
    names = ["points", "local_dist", "proj.w", "proj.b", "conv.w", "conv.b"]

    def draw(seed):
        args64, _ = make_inputs(lengths, device=device, seed=seed)
        args_lo = tuple(a.detach().to(dtype).requires_grad_(a.requires_grad) if a.is_floating_point() else a
                        for a in args64)
        ref64, ref_lo, out_lo = geo_conv_reference(*args64), geo_conv_reference(*args_lo), geo_conv_packed(*args_lo)
        return {"out": ([out_lo], [ref_lo], [ref64]),
                **{f"grad {n}": ([a], [b], [c]) for n, a, b, c in zip(names, grads(out_lo, args_lo, seed),
                                                                       grads(ref_lo, args_lo, seed),
                                                                       grads(ref64, args64, seed))}}

    assert_flash_rule(draw, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_flash_rule(device):
    _flash_rule([35, 17, 3, 60, 9, 120, 44, 28], torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_flash_rule(dtype, device):
    """float16/bfloat16 storage, float32 accumulation, on the CPU too (issue 44: bf16-mixed on the CPU)."""
    _flash_rule([35, 17, 3, 60, 9, 120, 44, 28], dtype, device)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    args, seed = make_inputs([4, 3, 6], device=device)
    assert torch.autograd.gradcheck(geo_conv_packed, args), seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_opcheck(case, dtype, device):
    for requires_grad in (True, False):
        args, _seed = make_inputs(LENGTH_CASES[case], dtype=dtype, device=device, requires_grad=requires_grad)
        torch.library.opcheck(torch.ops.stfast.geo_conv_forward.default, args)


def _transposed(t):
    """``t``'s values with reversed strides (a transposed, non-contiguous layout)."""
    return t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim())))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_on_transposed_inputs(device):
    """The backward op's fake (meta) kernel returns contiguous gradients, as the kernels do, whatever the
    strides of points and weights (opcheck compares the fake's strides with the real outputs')."""
    args, _seed = make_inputs(LENGTH_CASES["mixed"], device=device, requires_grad=False)
    points, offsets, _ld, w1, _b1, w2, _b2 = args
    out, hidden = torch.ops.stfast.geo_conv_forward(*args)
    pt, w1t, w2t = _transposed(points), _transposed(w1), _transposed(w2)
    assert not (pt.is_contiguous() or w1t.is_contiguous() or w2t.is_contiguous())
    grads = torch.ops.stfast.geo_conv_backward(torch.ones_like(out), pt, offsets, hidden, out, w1t, w2t)
    assert all(g.is_contiguous() for g in grads)
    torch.library.opcheck(torch.ops.stfast.geo_conv_backward.default,
                          (torch.randn_like(out), pt, offsets, hidden, out, w1t, w2t))


def _modules(dtype=torch.float64, device="cpu"):
    torch.manual_seed(fresh_seed())
    ref = ReferenceGeoConv(CFG).to(device, dtype)
    fused = GeoConv(CFG).to(device, dtype)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def _padded_inputs(B, L, dtype=torch.float64, device="cpu", seed=None):
    g = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    lng, lat = (torch.randn(B, L, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_() for _ in "ab")
    state = torch.randint(0, 2, (B, L), generator=g).to(device)
    ld = torch.randn(B, L - K + 1, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
    return lng, lat, state, ld


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,L", [(6, 25), (1, K), (1, 50), (4, K)])
def test_module_matches_reference_module(B, L, device):
    ref, fused = _modules(device=device)
    inputs = _padded_inputs(B, L, device=device)
    a, b = ref(*inputs), fused(*inputs)
    assert a.shape == b.shape == (B, L - K + 1, CFG.conv_channels + 1)
    assert rel_err(b, a) < 1e-10
    w = torch.randn_like(a)
    diff_in = [inputs[0], inputs[1], inputs[3]]
    ga = torch.autograd.grad((a * w).sum(), [*ref.parameters(), *diff_in])
    gb = torch.autograd.grad((b * w).sum(), [*fused.parameters(), *diff_in])
    for x, y in zip(gb, ga):
        assert rel_err(x, y) < 1e-10


@pytest.mark.parametrize("device", DEVICES)
def test_module_lengths_and_packed_agree(device):
    ref, fused = _modules(device=device)
    lengths = torch.tensor([30, 3, 12, 7])
    lng, lat, state, ld = _padded_inputs(4, 30, device=device)
    full = ref(lng, lat, state, ld)
    out = fused(lng, lat, state, ld, lengths=lengths)
    omask = torch.arange(28)[None, :] < (lengths - K + 1)[:, None]
    omask = omask.to(device)
    assert rel_err(out[omask], full[omask]) < 1e-10
    assert bool((out[~omask] == 0).all())
    pmask = (torch.arange(30)[None, :] < lengths[:, None]).to(device)
    offsets = torch.tensor([0, *lengths.cumsum(0).tolist()], device=device)
    packed = fused.forward_packed(lng[pmask], lat[pmask], state[pmask], ld[omask], offsets)
    assert rel_err(packed, full[omask]) < 1e-10
    assert output_offsets(offsets, K).tolist() == [0, 28, 29, 39, 44]


def test_state_dict_loads_both_ways():
    ref, fused = ReferenceGeoConv(CFG), GeoConv(CFG)
    assert {k: v.shape for k, v in ref.state_dict().items()} == {k: v.shape for k, v in fused.state_dict().items()}
    fused.load_state_dict(ref.state_dict())
    ref2 = ReferenceGeoConv(CFG)
    ref2.load_state_dict(fused.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ref2.state_dict()[k], v)
    torch.manual_seed(7)
    a = ReferenceGeoConv(CFG)
    torch.manual_seed(7)
    b = GeoConv(CFG)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))  # same init for the same seed


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    args, seed = make_inputs([7, 3, 11], device=device)
    pts, off, ld, w1, b1, w2, b2 = (a.detach() for a in args)
    pts_nc = pts.t().contiguous().t()  # same values, transposed strides
    ld_nc = torch.stack([ld, ld], 1)[:, 0]
    w2_nc = w2.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    off_nc = torch.stack([off, off], 1)[:, 1]
    assert not (pts_nc.is_contiguous() or ld_nc.is_contiguous() or w2_nc.is_contiguous() or off_nc.is_contiguous())
    out = geo_conv_packed(pts_nc, off_nc, ld_nc, w1, b1, w2_nc, b2)
    assert rel_err(out, geo_conv_reference(pts, off, ld, w1, b1, w2, b2)) < 1e-10, seed
    # non-contiguous incoming gradient
    pts_g = pts.clone().requires_grad_()
    out = geo_conv_packed(pts_g, off, ld, w1, b1, w2, b2)
    gout = torch.randn(out.shape[1], out.shape[0], dtype=out.dtype, device=device).t()
    (g,) = torch.autograd.grad(out, [pts_g], gout)
    pts_r = pts.clone().requires_grad_()
    (gr,) = torch.autograd.grad(geo_conv_reference(pts_r, off, ld, w1, b1, w2, b2), [pts_r], gout)
    assert rel_err(g, gr) < 1e-10, seed


@pytest.mark.parametrize("device", DEVICES)
def test_poisoned_buffers_every_element_written(device):
    args, seed = make_inputs([9, 3, 30, 4], device=device, requires_grad=False)
    n = sum(t.numel() for t in args) * 4
    for _ in range(3):  # leave NaN-filled blocks in the allocator for the op's outputs to reuse
        del_me = torch.full((n,), float("nan"), dtype=args[0].dtype, device=device)
        del del_me
    out, hidden = torch.ops.stfast.geo_conv_forward(*args)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(hidden).all()), seed
    grads_ = torch.ops.stfast.geo_conv_backward(torch.randn_like(out), args[0], args[1], hidden, out, args[3], args[5])
    assert all(bool(torch.isfinite(g).all()) for g in grads_), seed


def test_short_trip_is_value_error():
    args, _ = make_inputs([5, 2, 6], requires_grad=False)
    with pytest.raises(ValueError, match="trip 1 has 2 points"):
        geo_conv_packed(*args)
    _ref, fused = _modules()
    lng, lat, state, ld = _padded_inputs(2, 8)
    with pytest.raises(ValueError, match="kernel_size"):
        fused(lng, lat, state, ld, lengths=torch.tensor([8, 2]))
    with pytest.raises(ValueError, match="kernel_size"):
        fused(lng[:, :2], lat[:, :2], state[:, :2], ld[:, :0])


@pytest.mark.parametrize("device", DEVICES)
def test_weight_gradients_deterministic(device):
    args, seed = make_inputs([50, 3, 70, 33, 8, 91, 12, 5, 40], dtype=torch.float32, device=device)
    out = geo_conv_packed(*args)
    g1 = grads(out, args, seed)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        g2 = grads(geo_conv_packed(*args), args, seed)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2)), seed


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    _ref, fused = _modules(dtype=torch.float32, device=device)
    compiled = torch.compile(fused, fullgraph=True)
    lng, lat, state, ld = _padded_inputs(3, 12, dtype=torch.float32, device=device)
    out = compiled(lng, lat, state, ld)
    expect = fused(lng, lat, state, ld)
    torch.testing.assert_close(out, expect)
    (g,) = torch.autograd.grad(out.sum(), [compiled.conv.weight])
    (ge,) = torch.autograd.grad(expect.sum(), [fused.conv.weight])
    torch.testing.assert_close(g, ge)


@pytest.mark.skipif(stfast.build_info()["cuda"], reason="checks the CPU-only build's message")
def test_cpu_only_build_rejects_cuda_tensors():
    args, _ = make_inputs([4, 5], requires_grad=False)
    op = torch.ops.stfast.geo_conv_forward.default
    with pytest.raises(RuntimeError, match="stfast was built without CUDA support"):
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA), *args)


# --- issue 24: one validation path, degenerate sizes, no host syncs ---

def _error(fn):
    """(type, message) of the error ``fn()`` raises; fails when it raises nothing."""
    with pytest.raises((ValueError, RuntimeError)) as info:
        fn()
    return info.type, str(info.value).split("\n")[0]  # torch appends a C++ frame list below the first line


def _args_on(args, device):
    return tuple(a if i == 1 else a.to(device) for i, a in enumerate(args))  # offsets stay on the host


BAD_OFFSETS = {  # N = 10 points, k = 3
    "past_N": [0, 5, 4000],  # the heap overflow of issue 24 (row 11)
    "first_not_0": [2, 6, 10],
    "no_trip_for_points": [0],  # B = 0 with N > 0 (row 3 for the backward)
    "decreasing": [0, 6, 4, 10],
    "short_trip": [0, 2, 10],  # row 2 on CUDA
    "last_below_N": [0, 4, 8],
    "negative": [0, -3, 10],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(BAD_OFFSETS))
def test_invalid_offsets_same_error_on_every_device(case, device):
    """Rows 2, 3 and 11: bad offsets are ValueErrors from the one C++ check, with the CPU's message on every
    device, in the forward and the backward op and through the Python wrapper (offsets on either device)."""
    args, _ = make_inputs([5, 5], requires_grad=False)  # valid shapes for N = 10, B = 2
    off = torch.tensor(BAD_OFFSETS[case])
    pts, _, ld, w1, b1, w2, b2 = args
    h, out = torch.randn(10, 16, dtype=pts.dtype), torch.randn(ld.shape[0], 33, dtype=pts.dtype)

    def calls(dev):
        p, l_, a, b, c, d, hh, o = (t.to(dev) for t in (pts, ld, w1, b1, w2, b2, h, out))
        return [lambda: torch.ops.stfast.geo_conv_forward(p, off, l_, a, b, c, d),
                lambda: torch.ops.stfast.geo_conv_backward(torch.randn_like(o), p, off, hh, o, a, c),
                lambda: geo_conv_packed(p, off.to(dev), l_, a, b, c, d)]

    expected = [_error(f) for f in calls("cpu")]
    assert all(t is ValueError for t, _ in expected), expected
    assert [_error(f) for f in calls(device)] == expected


def test_invalid_offsets_messages_name_the_entry():
    """The CPU repro of issue 24 and its neighbours raise clear errors naming the offending entry."""
    args, _ = make_inputs([5, 5], requires_grad=False)
    expect = {"past_N": r"offsets\[2\] = 4000 exceeds N = 10", "first_not_0": r"offsets\[0\] must be 0, got 2",
              "no_trip_for_points": r"offsets\[B\] = offsets\[0\] = 0 must equal N = 10",
              "decreasing": r"offsets\[2\] = 4 < offsets\[1\] = 6", "short_trip": "trip 0 has 2 points",
              "last_below_N": r"offsets\[2\] = 8 must equal N = 10", "negative": r"offsets\[1\] = -3 < offsets\[0\]"}
    for case, pattern in expect.items():
        with pytest.raises(ValueError, match=pattern):
            geo_conv_packed(args[0], torch.tensor(BAD_OFFSETS[case]), *args[2:])


@pytest.mark.parametrize("device", DEVICES)
def test_backward_rejects_offsets_that_miss_points(device):
    """Row 3: offsets = [0] with N > 0 used to read offsets[1] out of bounds in the backward."""
    n, dt = 7, torch.float64
    args = (torch.randn(n, 4, dtype=dt), torch.tensor([0]), torch.randn(16, 4, dtype=dt), torch.randn(32, 16, K, dtype=dt))
    pts, off, w1, w2 = args
    hidden, out = torch.randn(n, 16, dtype=dt), torch.randn(n, 33, dtype=dt)  # N_out = N for B = 0
    t = [x.to(device) for x in (pts, hidden, out, w1, w2)]
    with pytest.raises(ValueError, match=r"stfast.geo_conv_backward: offsets\[B\] = offsets\[0\] = 0 must equal N = 7"):
        torch.ops.stfast.geo_conv_backward(torch.randn_like(t[2]), t[0], off, t[1], t[2], t[3], t[4])


@pytest.mark.parametrize("device", DEVICES)
def test_op_rejects_offsets_on_a_gpu_or_of_another_dtype(device):
    """offsets are host data for the ops (the wrapper copies a GPU tensor to the host); int64 only."""
    args, _ = make_inputs([4, 5], device=device, requires_grad=False)
    with pytest.raises(RuntimeError, match="offsets must be int64"):
        torch.ops.stfast.geo_conv_forward(args[0], args[1].int(), *args[2:])
    if device == "cuda":
        with pytest.raises(RuntimeError, match="offsets must be a CPU tensor"):
            torch.ops.stfast.geo_conv_forward(args[0], args[1].cuda(), *args[2:])


DEGENERATE = {  # (trip lengths, F_in, H, C)
    "B0": ([], 4, 16, 32),
    "F0": ([5, 3, 9], 0, 16, 32),
    "H0": ([5, 3, 9], 4, 0, 32),
    "C0": ([5, 3, 9], 4, 16, 0),
    "all0": ([], 0, 0, 0),
    "H0_C0": ([4, 6], 3, 0, 0),
    "small": ([3, 4], 2, 3, 5),  # P < 256 in every partials kernel: the row-sliced tile sums
}


def _grads_or_zeros(out, inputs, w):
    g = torch.autograd.grad((out * w).sum(), inputs, allow_unused=True)
    return [torch.zeros_like(t) if gi is None else gi for gi, t in zip(g, inputs)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(DEGENERATE))
def test_degenerate_sizes(case, device):
    """Row 4: B = 0 (N = 0), F_in = 0, H = 0 and C = 0 are valid on both devices (no empty CUDA grids):
    outputs and every gradient match the reference."""
    lengths, F_in, H, C = DEGENERATE[case]
    args, seed = make_inputs(lengths, device=device, F_in=F_in, H=H, C=C)
    out = geo_conv_packed(*args)
    ref = geo_conv_reference(*args)
    n_out = sum(lengths) - len(lengths) * (K - 1)
    assert out.shape == ref.shape == (n_out, C + 1), seed
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(out.shape, dtype=out.dtype, device=device)
    diff = [a for a in args if a.requires_grad]
    for a, b in zip(_grads_or_zeros(out, diff, w), _grads_or_zeros(ref, diff, w)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{m} (seed {seed})")
    raw_out, hidden = torch.ops.stfast.geo_conv_forward(*[a.detach() for a in args])
    assert hidden.shape == (sum(lengths), H)
    grads_ = torch.ops.stfast.geo_conv_backward(w, args[0].detach(), args[1], hidden, raw_out, args[3].detach(),
                                                args[5].detach())
    assert [tuple(g.shape) for g in grads_] == [(sum(lengths), F_in), (H, F_in), (H,), (C, H, K), (C,)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths_on", ["cpu", "points"])
def test_padded_lengths_checked_on_host(lengths_on, device):
    """Row 1: lengths > L or < k, or not (B,) integers, are ValueErrors whatever device lengths are on
    (they used to move to the points' device before the host check, so on CUDA nothing was checked)."""
    ref, fused = _modules(device=device)
    lng, lat, state, ld = _padded_inputs(3, 10, device=device)
    ldev = device if lengths_on == "points" else "cpu"
    for bad, pattern in [([10, 11, 4], r"\[kernel_size=3, L=10\].*max 11"), ([10, 2, 4], r"min 2"),
                         ([10, 4], r"\(B=3,\) integers"), ([10.0, 4.0, 5.0], "integers"),
                         ([True, True, True], "integers")]:  # bool: read as 1-point trips before
        with pytest.raises(ValueError, match=pattern):
            fused(lng, lat, state, ld, lengths=torch.tensor(bad, device=ldev))


def test_padded_local_dist_shape_and_sequence_lengths():
    """geo_conv_padded checks local_dist's shape (B, L − k + 1): a transposed or flat one was read in the wrong
    order; a sequence of lengths works as a tensor of them."""
    _ref, fused = _modules()
    lng, lat, state, ld = _padded_inputs(3, 10)
    points, weights = fused._features(lng, lat, state), fused._weights()
    for bad in (ld.T.contiguous(), ld.flatten(), ld[:, :-1]):
        with pytest.raises(ValueError, match=r"local_dist must be \(B, L − k \+ 1\) = \(3, 8\)"):
            geo_conv_padded(points, bad, *weights)
    lengths = [10, 4, 3]
    assert torch.equal(geo_conv_padded(points, ld, *weights, lengths=lengths),
                       geo_conv_padded(points, ld, *weights, lengths=torch.tensor(lengths)))


def test_a_meta_argument_among_real_ones_is_refused():
    """The dispatcher runs the fake kernel when any argument is a meta tensor; among real CPU tensors it
    returned uninitialized real tensors. Now refused, naming the arguments; meta data with host offsets
    (shape inference) still works."""
    args = [a.detach() for a in make_inputs([5, 7])[0]]
    for i in (0, 1, 2, 3):
        bad = list(args)
        bad[i] = bad[i].to("meta")
        with pytest.raises(ValueError, match="on the meta device but .* on cpu"):
            torch.ops.stfast.geo_conv_forward(*bad)
    meta = [a if i == 1 else a.to("meta") for i, a in enumerate(args)]
    out, hidden = torch.ops.stfast.geo_conv_forward(*meta)
    assert out.device.type == "meta" and out.shape == (12 - 2 * (K - 1), 33)


def test_padded_bad_lengths_rejected_by_the_op_when_traced(monkeypatch):
    """Under torch.compile the wrapper's own length check is skipped (it would need the data at trace time);
    the op's check of the offsets built from the lengths still rejects every bad length at run time."""
    _ref, fused = _modules()
    lng, lat, state, ld = _padded_inputs(3, 10)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for bad, pattern in [([10, 11, 4], r"offsets\[3\] = 25 exceeds N = 24"),
                         ([10, 2, 4], "trip 1 has 2 points"), ([10, -1, 4], "non-decreasing")]:
        with pytest.raises(ValueError, match=pattern):
            fused(lng, lat, state, ld, lengths=torch.tensor(bad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths_on", ["cpu", "points"])
def test_padded_lengths_match_reference(lengths_on, device):
    """Row 12's gather path (host-computed row indices instead of boolean masks): real rows equal the
    reference module's, padding rows are zero, gradients flow to every input."""
    ref, fused = _modules(device=device)
    lengths = torch.tensor([12, 3, 7, 3, 10])
    lng, lat, state, ld = _padded_inputs(5, 12, device=device)
    out = fused(lng, lat, state, ld, lengths=lengths.to(device if lengths_on == "points" else "cpu"))
    full = ref(lng, lat, state, ld)
    omask = (torch.arange(10)[None, :] < (lengths - K + 1)[:, None]).to(device)
    assert rel_err(out[omask], full[omask]) < 1e-10
    assert bool((out[~omask] == 0).all())
    w = torch.randn_like(out) * omask[..., None]
    ga = torch.autograd.grad((out * w).sum(), [lng, lat, ld, *fused.parameters()])
    gb = torch.autograd.grad((full * w).sum(), [lng, lat, ld, *ref.parameters()])
    for a, b in zip(ga, gb):
        assert rel_err(a, b) < 1e-10


def test_padded_lengths_path_has_no_data_dependent_device_op():
    """Row 12 on the CPU: with host lengths, geo_conv_padded runs on meta points (shapes only; any boolean-mask
    indexing or nonzero on the points' device would need their values and fail there), so on a GPU nothing
    in it waits for the stream."""
    ref, fused = _modules()
    lng, lat, state, ld = (t.detach().to("meta") for t in _padded_inputs(3, 9))
    fused = fused.to("meta")
    lengths = torch.tensor([9, 4, 3])
    out = geo_conv_padded(fused._features(lng, lat, state), ld, *fused._weights(), lengths=lengths)
    assert out.device.type == "meta" and out.shape == (3, 9 - K + 1, CFG.conv_channels + 1)


@pytest.mark.parametrize("device", DEVICES)
def test_two_level_reduction_many_tiles(device):
    """Row 5: a batch with hundreds of partial-sum tiles (N ~ 12,000 rows: the two-level reduction on CUDA)
    matches the float64 reference and is bitwise repeatable."""
    g = torch.Generator().manual_seed(fresh_seed())
    lengths = torch.randint(K, 80, (300,), generator=g).tolist()
    args, seed = make_inputs(lengths, device=device)
    out = geo_conv_packed(*args)
    g1, g2 = grads(out, args, seed), grads(geo_conv_packed(*args), args, seed)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2)), seed
    for a, b in zip(g1, grads(geo_conv_reference(*args), args, seed)):
        assert rel_err(a, b) < 1e-10, seed


@cuda_only
def test_no_host_sync_cuda():
    """Row 12 and the validation path: with host offsets / lengths, forward and backward on CUDA never sync
    the stream (torch's sync debug mode turns any sync into an error)."""
    ref, fused = _modules(dtype=torch.float32, device="cuda")
    lng, lat, state, ld = _padded_inputs(4, 20, dtype=torch.float32, device="cuda")
    lengths = torch.tensor([20, 3, 11, 8])
    args, seed = make_inputs([9, 3, 30], dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused(lng, lat, state, ld, lengths=lengths)
        # not state_em.weight: the embedding's own CUDA backward is torch's business, not this op's
        torch.autograd.grad(out.sum(), [lng, ld, *fused.proj.parameters(), *fused.conv.parameters()])
        out = geo_conv_packed(*args)
        torch.autograd.grad(out.sum(), [a for a in args if a.requires_grad])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda_only
def test_cuda_float32_reference_is_not_tf32():
    """Row 10: under this file's fixture a float32 cuDNN convolution is true float32 (TF32's error would be
    ~1e-3 relative), so the flash rule's float32 bounds on CUDA are as tight as on the CPU."""
    x = torch.randn(8, 16, 200, dtype=torch.float64, device="cuda")
    w = torch.randn(32, 16, K, dtype=torch.float64, device="cuda")
    err = rel_err(F.conv1d(x.float(), w.float()), F.conv1d(x, w))
    assert err < 1e-5, err
