"""The fused LSTM op (stfast.ops.lstm, stfast.nn.LSTM) against torch.nn.LSTM holding the same weights and
against the plain-PyTorch reference (stfast.ops.lstm_reference): outputs, h_n, c_n and every gradient, on
every available device.

Inputs are fresh random numbers each run (the seed is in every failure message); never zeros."""
import os
import subprocess
import sys

import pytest
import torch
from _accuracy import assert_flash_rule, fresh_seed
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import stfast
from stfast.nn import LSTM
from stfast.ops import (
    cpu_workspace_cached_bytes,
    empty_cpu_workspace_cache,
    lstm_packed,
    lstm_reference,
)

HAS_CUDA = torch.cuda.is_available() and stfast.build_info()["cuda"]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of stfast")
LENGTH_CASES = {
    "mixed_unsorted": [5, 17, 3, 40, 9, 17],
    "all_equal": [7, 7, 7],
    "B1": [23],
    "ones": [1, 1, 1, 1],
    "with_ones": [1, 12, 1, 6],
}


def rel_err(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max() / b.detach().double().abs().max().clamp_min(1e-300))


def pair(I, H, L, bias=True, batch_first=False, dtype=torch.float64, device="cpu", seed=None):
    """torch.nn.LSTM and stfast.nn.LSTM with the same random weights."""
    torch.manual_seed(fresh_seed() if seed is None else seed)
    ref = torch.nn.LSTM(I, H, L, bias=bias, batch_first=batch_first).to(device, dtype)
    fused = LSTM(I, H, L, bias=bias, batch_first=batch_first).to(device, dtype)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def padded_inputs(lengths, I, H, L, batch_first, dtype, device, seed, states):
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype).requires_grad_()
    hx = None
    if states:
        hx = tuple((torch.randn(L, B, H, generator=g, dtype=torch.float64) * 0.5).to(device, dtype).requires_grad_()
                   for _ in "hc")
    return x, hx


def all_grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=False)


def weighted_loss(out, h_n, c_n, seed):
    g = torch.Generator().manual_seed(seed + 1)

    def w(t):
        return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device, t.dtype)

    return (out * w(out)).sum() + (h_n * w(h_n)).sum() + (c_n * w(c_n)).sum()


def run_packed(mod, x, lengths, hx, batch_first):
    packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
    out, (h_n, c_n) = mod(packed, hx)
    assert isinstance(out, type(packed))
    return pad_packed_sequence(out, batch_first=batch_first)[0], h_n, c_n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("case", list(LENGTH_CASES))
def test_float64_matches_torch_lstm(case, states, batch_first, layout, device):
    seed = fresh_seed()
    lengths = LENGTH_CASES[case]
    if layout == "padded":  # torch.nn.LSTM on a padded tensor runs all T steps for every sequence
        lengths = [max(lengths)] * len(lengths)
    I, H, L = 5, 7, 2
    ref, fused = pair(I, H, L, batch_first=batch_first, device=device, seed=seed)
    x, hx = padded_inputs(lengths, I, H, L, batch_first, torch.float64, device, seed, states)
    diff = [x, *(hx or ())]
    results = []
    for mod in (ref, fused):
        if layout == "packed":
            out, h_n, c_n = run_packed(mod, x, lengths, hx, batch_first)
        else:
            out, (h_n, c_n) = mod(x, hx)
        grads = all_grads(weighted_loss(out, h_n, c_n, seed), [*diff, *mod.parameters()])
        results.append((out, h_n, c_n, grads))
    (ro, rh, rc, rg), (fo, fh, fc, fg) = results
    assert fo.shape == ro.shape and fh.shape == rh.shape
    for name, a, b in [("output", fo, ro), ("h_n", fh, rh), ("c_n", fc, rc)]:
        assert rel_err(a, b) < 1e-10, (name, seed)
    names = ["input", *(["h0", "c0"] if states else []), *[n for n, _ in fused.named_parameters()]]
    for name, a, b in zip(names, fg, rg):
        assert rel_err(a, b) < 1e-10, (name, seed)


@pytest.mark.parametrize("L,H", [(1, 32), (3, 32), (2, 128), (1, 256)])
@pytest.mark.parametrize("bias", [True, False])
def test_layers_and_widths_against_reference(L, H, bias):
    """stfast.ops.lstm_packed vs the plain-PyTorch reference over CSR input (float64)."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 1, 11, 4, 11]
    I = 9
    _ref, fused = pair(I, H, L, bias=bias, seed=seed)
    w = fused.all_weights
    x = torch.randn(sum(lengths), I, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = (torch.randn(L, len(lengths), H, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    c0 = (torch.randn(L, len(lengths), H, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    a = lstm_packed(x, offsets, w, L, h0, c0)
    b = lstm_reference(x, offsets, w, L, h0, c0)
    for p, q in zip(a, b):
        assert rel_err(p, q) < 1e-10, seed
    ga = all_grads(weighted_loss(*a, seed), [x, h0, c0, *w])
    gb = all_grads(weighted_loss(*b, seed), [x, h0, c0, *w])
    for p, q in zip(ga, gb):
        assert rel_err(p, q) < 1e-10, seed


def _flash_rule(dtype, device, lengths=(35, 17, 3, 60, 9, 1, 44, 28), H=128, L=2):
    """flash-attention's rule (tests/_accuracy.py): fused(dtype) against torch(f64), relative to
    torch(dtype)'s own error, for the outputs, h_n, c_n and every gradient."""
    I = 61

    def run(mod, x, hx, seed):
        out, h_n, c_n = run_packed(mod, x, list(lengths), hx, True)
        grads = all_grads(weighted_loss(out, h_n, c_n, seed), [x, *hx, *mod.parameters()])
        return [out.detach(), h_n.detach(), c_n.detach()], grads

    def draw(seed):
        ref64, _fused64 = pair(I, H, L, batch_first=True, device=device, seed=seed)
        ref_lo = torch.nn.LSTM(I, H, L, batch_first=True).to(device, dtype)
        ref_lo.load_state_dict(ref64.state_dict())
        fused_lo = LSTM(I, H, L, batch_first=True).to(device, dtype)
        fused_lo.load_state_dict(ref64.state_dict())
        x64, hx64 = padded_inputs(list(lengths), I, H, L, True, torch.float64, device, seed, True)
        x_lo = x64.detach().to(dtype).requires_grad_()
        hx_lo = tuple(t.detach().to(dtype).requires_grad_() for t in hx64)
        (o64, g64), (olo, glo), (ofu, gfu) = run(ref64, x64, hx64, seed), run(ref_lo, x_lo, hx_lo, seed), \
            run(fused_lo, x_lo, hx_lo, seed)
        return {"out": (ofu, olo, o64), "grad": (gfu, glo, g64)}

    assert_flash_rule(draw, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_flash_rule(device):
    _flash_rule(torch.float32, device)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_flash_rule_cuda(dtype):
    _flash_rule(dtype, "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    lengths, I, H, L = [3, 1, 4], 3, 4, 2
    _ref, fused = pair(I, H, L, device=device, seed=seed)
    w = [p.detach().clone().requires_grad_() for p in fused.all_weights]
    x = torch.randn(sum(lengths), I, generator=g, dtype=torch.float64).to(device).requires_grad_()
    h0, c0 = (torch.randn(L, 3, H, generator=g, dtype=torch.float64).to(device).requires_grad_() for _ in "hc")
    offsets = torch.tensor([0, 3, 4, 8])

    def f(x, h0, c0, *w):
        return lstm_packed(x, offsets, list(w), L, h0, c0)

    assert torch.autograd.gradcheck(f, (x, h0, c0, *w)), seed


def _op_samples(device, dtype):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    I, H, L = 4, 5, 2
    _ref, fused = pair(I, H, L, device=device, dtype=dtype, seed=seed)
    for case, lengths in LENGTH_CASES.items():
        B, T = len(lengths), max(lengths)
        lens = torch.tensor(lengths)
        for layout, shape in [(0, (sum(lengths), I)), (1, (B, T, I)), (2, (T, B, I))]:
            states, requires_grad = layout != 1, layout != 2  # every combination over the three layouts
            x = torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)
            w = [p.detach().clone().requires_grad_(requires_grad) for p in fused.all_weights]
            hx = [torch.randn(L, B, H, generator=g, dtype=torch.float64).to(device, dtype)
                  .requires_grad_(requires_grad) for _ in "hc"] if states else [None, None]
            yield (case, layout), (x.requires_grad_(requires_grad), lens, w, *hx, L, layout)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(dtype, device):
    n = 0
    for _name, args in _op_samples(device, dtype):
        torch.library.opcheck(torch.ops.stfast.lstm_forward.default, args)
        n += 1
    assert n == len(LENGTH_CASES) * 3


def test_padded_with_lengths_matches_packed():
    seed = fresh_seed()
    lengths = [9, 2, 14, 1]
    ref, fused = pair(6, 8, 2, batch_first=True, seed=seed)
    x, hx = padded_inputs(lengths, 6, 8, 2, True, torch.float64, "cpu", seed, True)
    out, (h_n, c_n) = fused(x, hx, lengths=torch.tensor(lengths))
    eo, eh, ec = run_packed(ref, x, lengths, hx, True)
    assert rel_err(out[:, : max(lengths)], eo) < 1e-10, seed
    mask = torch.arange(14)[None, :] < torch.tensor(lengths)[:, None]
    assert bool((out[~mask] == 0).all())
    assert rel_err(h_n, eh) < 1e-10 and rel_err(c_n, ec) < 1e-10, seed
    # the CSR form over the same sequences
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    po, (ph, pc) = fused.forward_packed(x[mask], offsets, hx)
    assert rel_err(po, eo[mask]) < 1e-10 and rel_err(ph, eh) < 1e-10 and rel_err(pc, ec) < 1e-10, seed


def test_unbatched_input_matches_torch():
    seed = fresh_seed()
    ref, fused = pair(3, 5, 2, seed=seed)
    x = torch.randn(7, 3, dtype=torch.float64)
    hx = tuple(torch.randn(2, 5, dtype=torch.float64) for _ in "hc")
    for a, b in zip(torch.utils._pytree.tree_leaves(fused(x, hx)), torch.utils._pytree.tree_leaves(ref(x, hx))):
        assert a.shape == b.shape and rel_err(a, b) < 1e-10, seed


@pytest.mark.parametrize("device", DEVICES)
def test_poisoned_buffers_every_element_written(device):
    seed = fresh_seed()
    _ref, fused = pair(6, 16, 2, device=device, dtype=torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 3, 30, 1])
    for layout in (0, 1):
        x = torch.randn(43, 6, generator=g) if layout == 0 else torch.randn(4, 30, 6, generator=g)
        x = x.to(device)
        for _ in range(3):  # leave NaN-filled blocks in the allocator for the op's outputs to reuse
            junk = torch.full((x.numel() * 200,), float("nan"), device=device)
            del junk
        outs = torch.ops.stfast.lstm_forward(x, lengths, [p.detach() for p in fused.all_weights], None, None, 2,
                                             layout)
        assert all(bool(torch.isfinite(t).all()) for t in outs), (layout, seed)
        grads = torch.ops.stfast.lstm_backward(torch.randn_like(outs[0]), None, None, x, lengths,
                                               [p.detach() for p in fused.all_weights], None, None, *outs[3:], 2,
                                               layout)
        flat = [grads[0], *grads[1], grads[2], grads[3]]
        assert all(bool(torch.isfinite(t).all()) for t in flat), (layout, seed)


def test_cpu_workspace_cache_reuses_poisoned_blocks_safely():
    """Workspaces of 2 MiB or more come from stfast's caching allocator (stfast.ops.workspace): a call that
    leaves NaN in every cached block (NaN input) must not leak into the next call, which reuses those blocks
    instead of growing the cache; empty_cpu_workspace_cache returns them all."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    empty_cpu_workspace_cache()
    assert cpu_workspace_cached_bytes() == 0
    _ref, fused = pair(6, 128, 2, dtype=torch.float32, seed=seed)
    w = [p.detach() for p in fused.all_weights]
    lengths = torch.randint(1, 120, (40,), generator=g)
    lengths[0] = 120  # padded (B, 120) rows: M > N, so the padding rows are in play too
    x = torch.randn(40, 120, 6, generator=g)
    for poison in (True, False):
        xin = torch.full_like(x, float("nan")) if poison else x
        outs = torch.ops.stfast.lstm_forward(xin, lengths, w, None, None, 2, 1)
        grads = torch.ops.stfast.lstm_backward(torch.randn_like(outs[0]), None, None, xin, lengths, w, None, None,
                                               *outs[3:], 2, 1)
        if poison:
            del outs, grads
            cached = cpu_workspace_cached_bytes()
            assert cached >= 40 * 120 * 4 * 128 * 4, cached  # at least the gates were cached
    assert cpu_workspace_cached_bytes() < cached  # the live results took their blocks from the cache
    flat = [*outs, grads[0], *grads[1], grads[2], grads[3]]
    assert all(bool(torch.isfinite(t).all()) for t in flat), seed
    mask = torch.arange(120)[None, :] < lengths[:, None]
    assert bool((outs[0][~mask] == 0).all()) and bool((grads[0][~mask] == 0).all())
    del outs, grads, flat
    empty_cpu_workspace_cache()
    assert cpu_workspace_cached_bytes() == 0


@pytest.mark.parametrize("value,ok", [("0", True), ("x12", False), ("-5", False)])
def test_cpu_workspace_cache_limit_from_environment(value, ok):
    """STFAST_CPU_WORKSPACE_CACHE_MB=0 disables the cache (results unchanged); a malformed value is a clear
    ValueError naming the variable, raised at the first large allocation."""
    script = (
        "import torch, stfast\n"
        "from stfast.nn import LSTM\n"
        "from stfast.ops import cpu_workspace_cached_bytes\n"
        "torch.manual_seed(0)\n"
        "m = LSTM(6, 128, 2, batch_first=True)\n"
        "o, _ = m(torch.randn(40, 120, 6))\n"
        "o.sum().backward()\n"
        "print('cached', cpu_workspace_cached_bytes())\n")
    env = {**os.environ, "STFAST_CPU_WORKSPACE_CACHE_MB": value}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    if ok:
        assert r.returncode == 0 and "cached 0" in r.stdout, r.stderr
    else:
        assert r.returncode != 0 and "STFAST_CPU_WORKSPACE_CACHE_MB must be a non-negative whole number" in r.stderr


@pytest.mark.parametrize("device", DEVICES)
def test_many_rows_blocked_gemms_match_torch(device):
    """Over 1,024 work rows the CPU driver runs its big GEMMs in row blocks (lstm_driver.h: mm_rows, mm_tn);
    float64 results still match torch.nn.LSTM, and a second call (cached workspaces) is bitwise the same."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(40, 160, (30,), generator=g).tolist()  # N >= 1,200 rows
    I, H, L = 6, 64, 2
    ref, fused = pair(I, H, L, batch_first=True, device=device, seed=seed)
    x, hx = padded_inputs(lengths, I, H, L, True, torch.float64, device, seed, True)
    results = []
    for mod in (ref, fused, fused):
        out, h_n, c_n = run_packed(mod, x, lengths, hx, True)
        grads = all_grads(weighted_loss(out, h_n, c_n, seed), [x, *hx, *mod.parameters()])
        results.append((out, h_n, c_n, *grads))
    for a, b, c in zip(*results):
        assert rel_err(b, a) < 1e-10, seed
        assert torch.equal(b, c), seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("used", ["output", "h_n", "c_n"])
def test_partial_gradients_match_torch(used, device):
    """An input that needs no gradient (the op then skips it: lstm_backward's input_grad=False) and a loss on
    only one of output / h_n / c_n (the others' gradients stay undefined): weight and state gradients still
    match torch.nn.LSTM (float64)."""
    seed = fresh_seed()
    lengths = [13, 4, 22, 1, 9]
    I, H, L = 5, 16, 2
    ref, fused = pair(I, H, L, device=device, seed=seed)
    x, hx = padded_inputs(lengths, I, H, L, False, torch.float64, device, seed, True)
    x = x.detach()
    results = []
    for mod in (ref, fused):
        out, h_n, c_n = run_packed(mod, x, lengths, hx, False)
        picked = {"output": out, "h_n": h_n, "c_n": c_n}[used]
        loss = (picked * torch.linspace(-1, 2, picked.numel(), dtype=picked.dtype, device=device).view_as(picked)).sum()
        results.append(all_grads(loss, [*hx, *mod.parameters()]))
    for a, b in zip(*results):
        assert rel_err(b, a) < 1e-10, (used, seed)
    # the op itself: input_grad=False gives a 0-element grad_input and the same weight gradients
    lens = torch.tensor(lengths)
    xp = torch.randn(sum(lengths), I, dtype=torch.float64, device=device)
    w = [p.detach() for p in fused.all_weights]
    outs = torch.ops.stfast.lstm_forward(xp, lens, w, None, None, L, 0)
    go = torch.randn_like(outs[0])
    full = torch.ops.stfast.lstm_backward(go, None, None, xp, lens, w, None, None, *outs[3:], L, 0)
    skip = torch.ops.stfast.lstm_backward(go, None, None, xp, lens, w, None, None, *outs[3:], L, 0, False)
    assert full[0].shape == xp.shape and skip[0].numel() == 0
    assert all(torch.equal(a, b) for a, b in zip(full[1], skip[1]))


def test_state_dict_loads_both_ways_and_same_init():
    ref, fused = torch.nn.LSTM(61, 128, 2, batch_first=True), LSTM(61, 128, 2, batch_first=True)
    assert {k: v.shape for k, v in ref.state_dict().items()} == {k: v.shape for k, v in fused.state_dict().items()}
    assert list(ref.state_dict()) == list(fused.state_dict())
    fused.load_state_dict(ref.state_dict())
    ref2 = torch.nn.LSTM(61, 128, 2, batch_first=True)
    ref2.load_state_dict(fused.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ref2.parameters(), ref.parameters()))
    torch.manual_seed(7)
    a = torch.nn.LSTM(10, 32, 3, bias=False)
    torch.manual_seed(7)
    b = LSTM(10, 32, 3, bias=False)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_gradients_deterministic(device):
    seed = fresh_seed()
    _ref, fused = pair(61, 64, 2, batch_first=True, device=device, dtype=torch.float32, seed=seed)
    lengths = [50, 3, 70, 33, 8, 91, 12, 5, 40]
    x, hx = padded_inputs(lengths, 61, 64, 2, True, torch.float32, device, seed, True)

    def grads():
        out, (h_n, c_n) = fused(x, hx, lengths=torch.tensor(lengths))
        return all_grads(weighted_loss(out, h_n, c_n, seed), [x, *hx, *fused.parameters()])

    g1, g2 = grads(), grads()
    assert all(torch.equal(a, b) for a, b in zip(g1, g2)), seed


def test_dropout_and_bad_arguments():
    mod = LSTM(4, 8, 2, dropout=0.5)
    x = torch.randn(5, 3, 4)
    with pytest.raises(NotImplementedError, match="dropout"):
        mod(x)
    mod.eval()  # in eval mode dropout has no effect (as torch.nn.LSTM)
    ref = torch.nn.LSTM(4, 8, 2, dropout=0.5).eval()
    ref.load_state_dict(mod.state_dict())
    assert rel_err(mod(x)[0], ref(x)[0]) < 1e-5
    with pytest.raises(ValueError, match="length 0"):
        mod(x, lengths=torch.tensor([5, 0, 2]))
    with pytest.raises(ValueError, match="padded length 5"):
        mod(x, lengths=torch.tensor([5, 6, 2]))
    with pytest.raises(ValueError, match="lengths sum to"):
        lstm_packed(torch.randn(10, 4), torch.tensor([0, 4, 9]), mod.all_weights, 2)
    with pytest.raises(ValueError, match="h0 must be"):
        mod(x, (torch.randn(2, 2, 8), torch.randn(2, 3, 8)))
    with pytest.raises(ValueError, match="hidden_size"):
        LSTM(4, 0)
    with pytest.raises(ValueError, match="dropout"):
        LSTM(4, 8, dropout=1.5)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    seed = fresh_seed()
    _ref, fused = pair(6, 16, 2, batch_first=True, device=device, dtype=torch.float32, seed=seed)
    compiled = torch.compile(fused, fullgraph=True)
    lengths = torch.tensor([7, 2, 12])
    x, hx = padded_inputs([12, 12, 12], 6, 16, 2, True, torch.float32, device, seed, True)
    for kwargs in ({}, {"lengths": lengths}):
        out, (h_n, _c_n) = compiled(x, hx, **kwargs)
        eo, (eh, _ec) = fused(x, hx, **kwargs)
        torch.testing.assert_close(out, eo)
        torch.testing.assert_close(h_n, eh)
        (g,) = torch.autograd.grad(out.sum() + h_n.sum(), [compiled.weight_hh_l1])
        (ge,) = torch.autograd.grad(eo.sum() + eh.sum(), [fused.weight_hh_l1])
        torch.testing.assert_close(g, ge)


@pytest.mark.skipif(stfast.build_info()["cuda"], reason="checks the CPU-only build's message")
def test_cpu_only_build_rejects_cuda_tensors():
    _ref, fused = pair(3, 4, 1, dtype=torch.float32)
    args = (torch.randn(5, 3), torch.tensor([2, 3]), [p.detach() for p in fused.all_weights], None, None, 1, 0)
    op = torch.ops.stfast.lstm_forward.default
    with pytest.raises(RuntimeError, match="stfast was built without CUDA support"):
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA), *args)
