"""The model's linear layers on the chosen CPU GEMM library (issue 51, docs/gemm.md): ``stfast.nn.Linear`` is
``F.linear`` bit for bit where ``aten`` is chosen, holds the float32 flash-attention rule against float64 on the
other libraries (and the bfloat16 one under autocast where the CPU has a 16-bit library besides ATen), the fused
DeepTTE's linear layers run through ``stfast::gemm_mm`` when another library is chosen, the reference model
stays stock, and the state dict keeps its layout."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _accuracy import assert_flash_rule, fresh_seed
from conftest import random_trips, require_gemm_library
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

import stfast.nn.linear as linear_module
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from stfast.nn import Linear
from stfast.ops.gemm import mm, select_gemm_library, use_micro_kernel

# a local-estimator layer over every point, the entire estimator's input layer, its output layer (model shapes)
SHAPES = [((7, 33, 128), 64), ((7, 156), 128), ((7, 128), 1)]
# the products of a linear layer's forward and backward, by whatever library: what must not run for a layer
# whose product is routed to stfast::gemm_mm
ATEN_PRODUCTS = ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm")

pytestmark = pytest.mark.usefixtures("fresh_gemm_choices")


class _Calls(TorchDispatchMode):
    """The operand dtypes of each stfast::gemm_mm call (below autocast: what the library gets)."""

    def __init__(self):
        super().__init__()
        self.gemm_mm: list[tuple[str, ...]] = []
        self.out_dtypes: list[torch.dtype | None] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "gemm_mm":
            self.gemm_mm.append(tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor)))
            self.out_dtypes.append(args[2] if len(args) > 2 else kwargs.get("out_dtype") if kwargs else None)
        return func(*args, **(kwargs or {}))


def _layer_pair(in_f, out_f, seed, dtype):
    """A stfast.nn.Linear and a torch.nn.Linear with the same fresh random parameters in ``dtype``."""
    torch.manual_seed(seed)
    ours = Linear(in_f, out_f).to(dtype)
    stock = torch.nn.Linear(in_f, out_f).to(dtype)
    stock.load_state_dict(ours.state_dict())
    return ours, stock


def _forward_backward(layer, x, cotangent):
    """layer(x) and the gradients of ⟨layer(x), cotangent⟩ w.r.t. x, weight, bias."""
    x = x.detach().requires_grad_()
    y = layer(x)
    grads = torch.autograd.grad((y.to(cotangent.dtype) * cotangent).sum(), [x, layer.weight, layer.bias])
    return y.detach(), list(grads)


@pytest.mark.parametrize("dtype,float32_library", [(torch.float32, "aten"), (torch.float64, "aten"),
                                                     (torch.float64, "brgemm")])
def test_aten_chosen_is_f_linear_bit_for_bit(dtype, float32_library):
    """With ``aten`` the bulk library of the dtype (float32 pinned to it; float64 has only it, whatever float32
    has) the layer is F.linear: output and every gradient bitwise, and no stfast::gemm_mm call."""
    select_gemm_library(torch.float32, float32_library)
    for (shape, out_f) in SHAPES:
        seed = fresh_seed()
        ours, stock = _layer_pair(shape[-1], out_f, seed, dtype)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, generator=g, dtype=dtype)
        cot = torch.randn(*shape[:-1], out_f, generator=g, dtype=dtype)
        with _Calls() as calls:
            y, grads = _forward_backward(ours, x, cot)
        y_ref, grads_ref = _forward_backward(stock, x, cot)
        assert calls.gemm_mm == []
        assert torch.equal(y, y_ref), seed
        for a, b in zip(grads, grads_ref):
            assert torch.equal(a, b), seed


@pytest.mark.parametrize("library", ["brgemm", "onednn"])
def test_float32_flash_rule_per_library(library):
    """float32 through another library: within the flash-attention rule (tests/_accuracy.py) against float64,
    relative to F.linear's own float32 error, for the output and the gradients of x, weight and bias; every
    product (forward, input and weight gradients) goes through stfast::gemm_mm. A one-output layer: the dot
    product's error bound instead (:func:`_one_output_within_the_dot_product_bound` says why)."""
    require_gemm_library(library)
    select_gemm_library(torch.float32, library)
    for shape, out_f in SHAPES:
        if out_f == 1:
            _one_output_within_the_dot_product_bound(shape)
            continue

        def draw(seed, shape=shape, out_f=out_f):
            ours, stock = _layer_pair(shape[-1], out_f, seed, torch.float32)
            stock64 = torch.nn.Linear(shape[-1], out_f).double()
            stock64.load_state_dict(stock.state_dict())
            g = torch.Generator().manual_seed(seed)
            x64 = torch.randn(*shape, generator=g, dtype=torch.float64)
            cot = torch.randn(*shape[:-1], out_f, generator=g, dtype=torch.float64)
            with _Calls() as calls:
                y, grads = _forward_backward(ours, x64.float(), cot.float())
            assert calls.gemm_mm == [("torch.float32",) * 2] * 3, calls.gemm_mm  # forward, dx, dW
            y_lo, grads_lo = _forward_backward(stock, x64.float(), cot.float())
            y64, grads64 = _forward_backward(stock64, x64, cot)
            return {"out": ([y], [y_lo], [y64]), "grad": (grads, grads_lo, grads64)}

        assert_flash_rule(draw, torch.float32)


def _one_output_within_the_dot_product_bound(shape):
    """A one-output layer (a dot product per row) through the chosen library: its output within the classic
    float32 bound of a K-term dot product, |ŷ − y| ≤ γ_K · (|x| · |w|ᵀ + |b|), γ_K = K·u/(1 − K·u) (Higham,
    Accuracy and Stability of Numerical Algorithms, §3.1), against float64 on the rounded inputs, on fresh draws.
    Not the flash rule: on the Zen 3 EPYC the micro-kernel's error here was ~1.6× MKL's matrix-vector product's
    (medians of 60 draws at 7 × 128 × 1; single draws up to ~2.7×), and the 2× rule failed once in a CI run.
    The model's heads stay torch.nn.Linear, so this shape serves no DeepTTE layer."""
    u = torch.finfo(torch.float32).eps / 2
    for _ in range(5):
        seed = fresh_seed()
        ours, stock = _layer_pair(shape[-1], 1, seed, torch.float32)
        torch.nn.init.normal_(ours.bias)
        g = torch.Generator().manual_seed(seed)
        x64 = torch.randn(*shape, generator=g, dtype=torch.float64)
        with _Calls() as calls:
            y = ours(x64.float())
        assert calls.gemm_mm == [("torch.float32",) * 2], calls.gemm_mm
        w, b = ours.weight.detach().double(), ours.bias.detach().double()
        k = shape[-1] + 1  # the products and the bias
        gamma = k * u / (1 - k * u)
        exact = x64.float().double() @ w.t() + b
        bound = gamma * (x64.float().double().abs() @ w.abs().t() + b.abs())
        assert bool(((y.double() - exact).abs() <= bound).all()), seed


def _model(kernels, seed=0, dtype=torch.float32):
    """A DeepTTE with ``kernels`` in ``dtype`` (initial weights from ``seed``) and a batch of 9 random trips."""
    trips = random_trips(9, seed=3, min_len=4, max_len=30)
    vocab = DriverVocab(trips.driver)
    torch.manual_seed(seed)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), kernels=kernels), NormStats.from_trips(trips)).to(dtype)
    return model, TripDataset(trips, vocab, dtype).batch(np.arange(9))


def _profiled_step(model, b):
    """Event names of a training step's forward and of its backward: {name: count} each."""
    with profile(activities=[ProfilerActivity.CPU]) as fwd:
        p = loss_parts(model, model(b), b)
        loss = combine_loss(p, 0.3, p.n_trips, p.n_local)
    with profile(activities=[ProfilerActivity.CPU]) as bwd:
        loss.backward()
    count = lambda prof: {e.key: e.count for e in prof.key_averages()}  # noqa: E731
    return count(fwd), count(bwd)


def test_fused_model_linear_layers_run_through_the_chosen_library():
    """brgemm forced for float32: one fused DeepTTE training step runs each linear layer's product through
    stfast::gemm_mm (7 layers: attention's attr_proj, the entire estimator's inp and 3 residual, the local
    estimator's 2 hidden), its input and weight gradients too; the two one-output heads stay torch.nn.Linear (a
    matrix-vector product) and are the only ATen products (the geo-conv and the LSTM do their own: csrc/). The reference model under the same choice stays stock:
    torch.nn.Linear, aten::linear, no stfast::gemm_mm."""
    require_gemm_library("brgemm")
    select_gemm_library(torch.float32, "brgemm")
    model, b = _model("fused")
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(layers) == 7
    fwd, bwd = _profiled_step(model, b)
    assert fwd.get("stfast::gemm_mm") == 7, fwd
    assert bwd.get("stfast::gemm_mm") == 14, bwd  # every layer's input needs its gradient: dx and dW each
    aten = {n: (fwd.get(n), bwd.get(n)) for n in ATEN_PRODUCTS}
    assert aten == {"aten::linear": (2, None), "aten::addmm": (2, None), "aten::mm": (None, 4),  # the heads
                    "aten::matmul": (None, None), "aten::bmm": (None, None)}, aten

    ref, b = _model("reference")
    assert not any(isinstance(m, Linear) for m in ref.modules())
    fwd, bwd = _profiled_step(ref, b)
    assert "stfast::gemm_mm" not in fwd and "stfast::gemm_mm" not in bwd
    assert fwd.get("aten::linear") == 10, fwd  # the 9 above and the plain geo-conv's projection


def test_state_dict_layout_unchanged():
    """The fused model's state dict has the layout of every checkpoint before (the linear layers were
    torch.nn.Linear, as the reference model's still are): same keys, shapes and dtypes, the same initial values
    for a seed, and a reference state dict loads strictly and gives the same outputs."""
    seed = fresh_seed()
    fused, b = _model("fused", seed, torch.float64)
    ref, _ = _model("reference", seed, torch.float64)
    sf, sr = fused.state_dict(), ref.state_dict()
    assert list(sf) == list(sr)
    for k in sr:
        assert sf[k].shape == sr[k].shape and sf[k].dtype == sr[k].dtype, k
        assert torch.equal(sf[k], sr[k]), (k, seed)
    other, _ = _model("fused", seed + 1, torch.float64)
    assert not torch.equal(other.entire.inp.weight, fused.entire.inp.weight)
    other.load_state_dict(sr, strict=True)
    assert torch.equal(other(b).time, fused(b).time)


def test_gemm_mm_takes_part_in_autocast():
    """Under torch.autocast("cpu", bfloat16) stfast::gemm_mm gets bfloat16 operands (autocast's lower-precision
    policy, as aten::mm): a float32 output is the float32 sum of the bfloat16-rounded operands' products, a
    default output is bfloat16, and gradients come back to the float32 leaves in float32."""
    g = torch.Generator().manual_seed(fresh_seed())
    a = torch.randn(37, 64, generator=g, requires_grad=True)
    b = torch.randn(64, 48, generator=g, requires_grad=True)
    rounded = a.detach().bfloat16().double() @ b.detach().bfloat16().double()
    with torch.autocast("cpu", torch.bfloat16):
        out32 = mm(a, b, torch.float32)
        out16 = mm(a, b)
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    torch.testing.assert_close(out32.double(), rounded, rtol=1e-5, atol=1e-5 * float(rounded.abs().max()))
    unrounded = a.detach().double() @ b.detach().double()
    assert float((out32.detach().double() - unrounded).abs().max()) > 1e-3  # not the float32 operands' product
    out32.sum().backward()
    assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.float32


def _autocast_draw(seed, shape, out_f):
    """One autocast-bfloat16 case: {group: (stfast.nn.Linear, F.linear (both under autocast), float64)}."""
    ours, stock = _layer_pair(shape[-1], out_f, seed, torch.float32)
    stock64 = torch.nn.Linear(shape[-1], out_f).double()
    stock64.load_state_dict(stock.state_dict())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    cot = torch.randn(*shape[:-1], out_f, generator=g)
    with torch.autocast("cpu", torch.bfloat16), _Calls() as calls:
        y, grads = _forward_backward(ours, x, cot)
    assert calls.gemm_mm and calls.gemm_mm[0] == ("torch.bfloat16",) * 2, calls.gemm_mm
    with torch.autocast("cpu", torch.bfloat16):
        y_lo, grads_lo = _forward_backward(stock, x, cot)
    assert y.dtype == y_lo.dtype == torch.bfloat16  # F.linear's dtype under autocast
    assert all(t.dtype == torch.float32 for t in grads)  # float32 master weights, float32 input
    y64, grads64 = _forward_backward(stock64, x.double(), cot.double())
    return {"out": ([y], [y_lo], [y64]), "grad": (grads, grads_lo, grads64)}


@pytest.mark.parametrize("kernel", ["torch", "reference"])
def test_autocast_bfloat16_on_the_micro_kernel(kernel):
    """Where the micro-kernel takes bfloat16 (AVX512-BF16, AMX; on any CPU through the reference seam): under
    autocast the layer runs bfloat16 operands with float32 sums through stfast::gemm_mm, returns bfloat16 like
    F.linear, and holds the flash-attention rule in bfloat16 against float64 relative to autocast F.linear's own
    error; the model's tail widths (N 1, 64, 128; depth 128, 156) included."""
    with use_micro_kernel(kernel):
        require_gemm_library("brgemm", torch.bfloat16, torch.float32)
        select_gemm_library(torch.bfloat16, "brgemm", torch.float32)
        for shape, out_f in SHAPES:
            assert_flash_rule(lambda seed, s=shape, o=out_f: _autocast_draw(seed, s, o), torch.bfloat16)


def test_autocast_path_on_any_cpu(monkeypatch):
    """The layer's own autocast path, run on any CPU by routing it as if a 16-bit library besides ATen were
    chosen (the products then run in whatever library takes (bfloat16, float32) here; ATen widens the operands,
    exact products): bfloat16 operands into stfast::gemm_mm, float32 sums and bias, one rounding to bfloat16."""
    monkeypatch.setattr(linear_module, "_through_chosen_library", lambda operands: True)
    for shape, out_f in SHAPES:
        assert_flash_rule(lambda seed, s=shape, o=out_f: _autocast_draw(seed, s, o), torch.bfloat16)
    layer, _ = _layer_pair(128, 64, fresh_seed(), torch.float32)
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(5, 128)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        y = layer(x)
    w, bias = layer.weight.detach(), layer.bias.detach()
    once = (x.bfloat16().double() @ w.bfloat16().double().t() + bias.double()).bfloat16()
    assert float((y.double() - once.double()).abs().max()) <= 2.0 ** -8 * float(once.double().abs().max())


def test_autocast_runs_through_the_library_when_aten_is_chosen():
    """Under autocast bfloat16 with ``aten`` chosen for (bfloat16, float32) — every CPU without AMX — the layer
    still runs through stfast::gemm_mm (ATen's widened float32 GEMM: exact products, float32 sums), not torch's
    own 16-bit ``linear`` (3.6–5.8 GFLOP/s on the Zen 3 EPYC, against 44–71), and its gradients' products take
    bfloat16 operands with a float32 output, never the (bfloat16, bfloat16) pair (torch's 16-bit mm there). Before,
    the layer was F.linear here: no gemm_mm call."""
    select_gemm_library(torch.bfloat16, "aten", torch.float32)
    for shape, out_f in SHAPES[:2]:
        seed = fresh_seed()
        layer, _ = _layer_pair(shape[-1], out_f, seed, torch.float32)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, generator=g)
        with torch.autocast("cpu", torch.bfloat16), _Calls() as calls:
            y, grads = _forward_backward(layer, x, torch.randn(*shape[:-1], out_f, generator=g))
        assert calls.gemm_mm == [("torch.bfloat16",) * 2] * 3, calls.gemm_mm  # forward, dx, dW
        assert calls.out_dtypes == [torch.float32] * 3, calls.out_dtypes
        assert y.dtype == torch.bfloat16 and all(t.dtype == torch.float32 for t in grads)
        w = layer.weight.detach()
        once = (x.bfloat16().double() @ w.bfloat16().double().t() + layer.bias.detach().double()).bfloat16()
        assert float((y.double() - once.double()).abs().max()) <= 2.0 ** -8 * float(once.double().abs().max()), seed


def test_autocast_path_keeps_one_weight_cast_per_step(monkeypatch):
    """Inside a KeptCasts block (one optimizer step, stfast.ops.weight_casts) the layer's weight is cast to
    bfloat16 once for all the step's forward passes, as torch.nn.Linear's is (before: gemm.linear handed
    gemm_mm's Autocast kernel the weight's transpose, a view, which was cast anew in every forward pass)."""
    from stfast.ops.weight_casts import KeptCasts

    monkeypatch.setattr(linear_module, "_through_chosen_library", lambda operands: True)
    layer, _ = _layer_pair(32, 16, fresh_seed(), torch.float32)
    x = torch.randn(4, 32)
    with KeptCasts("cpu", layer.parameters()) as block:
        for _ in range(3):
            with torch.autocast("cpu", torch.bfloat16):
                layer(x).float().sum().backward()
    assert block.made == 1
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
