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
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-300))


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


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_flash_rule_cuda(dtype):
    _flash_rule([35, 17, 3, 60, 9, 120, 44, 28], dtype, "cuda")


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
