"""Property tests (hypothesis) of the fused LSTM's argument handling (issue 24, "one validation path").

Arbitrary — mostly invalid — lengths, offsets, batch sizes, layouts and shapes at
``torch.ops.stfast.lstm_forward`` / ``lstm_backward`` and at the Python wrappers (stfast.ops.lstm). The only
outcomes allowed: a result equal to the pure-PyTorch reference (stfast.ops.lstm_reference), or ValueError /
RuntimeError; never a signal (a crash ends the pytest process, so the run fails; pytest's faulthandler
prints where). Which of the two is decided by the rules written out again here (``_forward_valid`` …), so
an accepted invalid input fails as surely as a refused valid one.

Bounded for CI: CPU, float64, tiny sizes, a fixed example sequence (derandomize), no deadline.
"""
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stfast.ops import lstm_packed, lstm_padded, lstm_reference
from stfast.ops.lstm import lstm_packed_sequence

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REFUSED = (ValueError, RuntimeError)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HUGE = [2**31, 2**62, 2**63 - 1, -(2**63)]


# --- the rules, stated independently of the C++ checks ---

def _weights_valid(weights, L, I, dtype):
    """torch.nn.LSTM's per-layer [w_ih (4H, I_k), w_hh (4H, H)(, b_ih, b_hh (4H,))]; returns H or None."""
    if L < 1 or len(weights) not in (2 * L, 4 * L) or weights[1].dim() != 2:
        return None
    H, per = weights[1].shape[1], len(weights) // L
    for k in range(L):
        shapes = [(4 * H, I if k == 0 else H), (4 * H, H)] + [(4 * H,)] * (per - 2)
        for w, shape in zip(weights[per * k: per * (k + 1)], shapes):
            if tuple(w.shape) != shape or w.dtype != dtype:
                return None
    return H


def _states_valid(states, L, B, H, dtype):
    return all(s is None or (tuple(s.shape) == (L, B, H) and s.dtype == dtype) for s in states)


def _forward_valid(x, lengths, weights, h0, c0, L, layout):
    if layout not in (0, 1, 2, 3) or L < 1 or x.dtype not in FLOATS:
        return False
    padded = layout in (1, 2)
    if x.dim() != (3 if padded else 2) or lengths.dim() != 1 or lengths.dtype != torch.int64:
        return False
    lens = lengths.tolist()
    if padded:
        B, T = (x.shape[0], x.shape[1]) if layout == 1 else (x.shape[1], x.shape[0])
        if B != len(lens) or any(not 1 <= n <= T for n in lens):
            return False
    elif any(n < 1 for n in lens) or sum(lens) != x.shape[0]:
        return False
    if layout == 3 and any(a < b for a, b in zip(lens, lens[1:])):
        return False
    H = _weights_valid(weights, L, x.shape[-1], x.dtype)
    return H is not None and _states_valid((h0, c0), L, len(lens), H, x.dtype)


# --- layouts <-> CSR rows, for the reference ---

def _step_offsets(lens):
    T = max(lens, default=0)
    batch = [sum(n > t for n in lens) for t in range(T)]
    return [sum(batch[:t]) for t in range(T)]


def _rows_index(lens, layout, x_shape):
    """Flat row index (into the input viewed as (M, C)) of each CSR row, sequence by sequence."""
    if layout == 0:
        return list(range(sum(lens)))
    if layout == 3:
        off = _step_offsets(lens)
        return [off[t] + b for b, n in enumerate(lens) for t in range(n)]
    if layout == 1:
        T = x_shape[1]
        return [b * T + t for b, n in enumerate(lens) for t in range(n)]
    B = x_shape[1]
    return [t * B + b for b, n in enumerate(lens) for t in range(n)]


def _reference(x, lens, weights, L, h0, c0, layout):
    """The plain-PyTorch reference in the op's layout: (output, h_n, c_n)."""
    idx = torch.tensor(_rows_index(lens, layout, x.shape), dtype=torch.int64)
    flat = x.reshape(x.shape[:-1].numel(), x.shape[-1])
    offsets = torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()])
    out, h_n, c_n = lstm_reference(flat[idx], offsets, weights, L, h0, c0)
    H = weights[1].shape[1]
    full = out.new_zeros(flat.shape[0], H).index_copy(0, idx, out)
    return full.view(*x.shape[:-1], H), h_n, c_n


def _close(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    if b.numel():
        assert float((a - b).abs().max()) <= 1e-10 * max(1.0, float(b.abs().max()))


def _outcome(valid: bool, call):
    """``call()``'s result when the rules call the input valid (None when refused): a refusal must be a
    ValueError/RuntimeError of an invalid input, and an invalid input must be refused."""
    try:
        result = call()
    except REFUSED as e:
        assert not valid, f"valid input refused: {e}"
        event("refused")
        return None
    assert valid, "invalid input accepted"
    event("result checked")
    return result


def _check_against_reference(got, x, lens, weights, L, h0, c0, layout):
    for a, b in zip(got, _reference(x, lens, weights, L, h0, c0, layout)):
        _close(a, b)


# --- strategies: a valid case, then up to three mutations that usually break it ---

@st.composite
def _forward_args(draw, mutate=True):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    L, H, I = draw(st.integers(1, 2)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    layout, B = draw(st.integers(0, 3)), draw(st.integers(0, 4))
    lens = draw(st.lists(st.integers(1, 4), min_size=B, max_size=B))
    if layout == 3:
        lens.sort(reverse=True)
    T = max(lens, default=0) + draw(st.integers(0, 1))
    rows = sum(lens)
    n_bias = 2 if draw(st.booleans()) else 0
    w_shapes = [s for k in range(L) for s in [(4 * H, I if k == 0 else H), (4 * H, H)] + [(4 * H,)] * n_bias]
    state_shapes = [(L, B, H) if draw(st.booleans()) else None for _ in "hc"]
    num_layers, lens_dtype, x_dtype, w_dtype, x_extra = L, torch.int64, torch.float64, {}, False
    ops = draw(st.lists(st.sampled_from([
        "length", "add_length", "drop_length", "rows", "T", "layout", "num_layers", "drop_weight",
        "weight_shape", "state_shape", "lens_dtype", "x_dtype", "w_dtype", "x_dim"]), min_size=1, max_size=3)) \
        if mutate else []
    for op in ops:
        if op == "length" and lens:
            lens[draw(st.integers(0, len(lens) - 1))] = draw(st.integers(-3, 8) | st.sampled_from(HUGE))
        elif op == "add_length":
            lens.append(draw(st.integers(-1, 5) | st.sampled_from(HUGE)))
        elif op == "drop_length" and lens:
            lens.pop(draw(st.integers(0, len(lens) - 1)))
        elif op == "rows":
            rows = max(0, rows + draw(st.integers(-2, 2)))
        elif op == "T":
            T = draw(st.integers(0, 6))
        elif op == "layout":
            layout = draw(st.sampled_from([-1, 4, 99, 0, 1, 2, 3]))
        elif op == "num_layers":
            num_layers = draw(st.integers(-1, 4))
        elif op == "drop_weight" and w_shapes:
            w_shapes.pop(draw(st.integers(0, len(w_shapes) - 1)))
        elif op == "weight_shape" and w_shapes:
            w_shapes[draw(st.integers(0, len(w_shapes) - 1))] = tuple(
                draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
        elif op == "state_shape":
            state_shapes[draw(st.integers(0, 1))] = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=4)))
        elif op == "lens_dtype":
            lens_dtype = draw(st.sampled_from([torch.int32, torch.float64]))
        elif op == "x_dtype":
            x_dtype = draw(st.sampled_from([torch.float32, torch.int64]))
        elif op == "w_dtype" and w_shapes:
            w_dtype[draw(st.integers(0, len(w_shapes) - 1))] = torch.float32
        elif op == "x_dim":
            x_extra = True
    rows_layout = layout if layout in (0, 1, 2, 3) else draw(st.integers(0, 3))
    shape = {0: (rows, I), 3: (rows, I), 1: (B, T, I), 2: (T, B, I)}[rows_layout]
    if x_extra:
        shape = (1, *shape)

    def rnd(shape, dtype=torch.float64):
        t = torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5
        return t.to(dtype) if dtype.is_floating_point else (t * 4).to(dtype)

    x = rnd(shape, x_dtype)
    lengths = torch.tensor(lens, dtype=torch.int64).to(lens_dtype)  # int32: wraps; the rules read the result
    weights = [rnd(s, w_dtype.get(i, torch.float64)) for i, s in enumerate(w_shapes)]
    h0, c0 = (None if s is None else rnd(s) for s in state_shapes)
    return x, lengths, weights, h0, c0, num_layers, layout


# --- the properties ---

@SETTINGS
@given(_forward_args())
def test_forward_op_result_or_clean_error(args):
    x, lengths, weights, h0, c0, L, layout = args
    result = _outcome(_forward_valid(*args), lambda: torch.ops.stfast.lstm_forward(*args))
    if result is not None:
        _check_against_reference(result[:3], x, lengths.tolist(), weights, L, h0, c0, layout)


@st.composite
def _backward_args(draw):
    """A valid forward, its saved tensors and output gradients, then up to two mutations of those."""
    x, lengths, weights, h0, c0, L, layout = draw(_forward_args(mutate=False))
    out, h_n, c_n, gates, cells, hiddens = torch.ops.stfast.lstm_forward(x, lengths, weights, h0, c0, L, layout)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    grads = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out, h_n, c_n)]
    grads[1:] = [t if draw(st.booleans()) else None for t in grads[1:]]
    saved = [gates, cells, hiddens]
    touched = False
    for op in draw(st.lists(st.sampled_from(["grad_shape", "grad_dtype", "saved_shape", "saved_dtype",
                                             "saved_layout", "lengths", "input_rows"]), max_size=2)):
        touched = True
        if op == "grad_shape":
            i = draw(st.integers(0, 2))
            grads[i] = torch.randn(*draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)), dtype=torch.float64)
        elif op == "grad_dtype":
            grads[0] = grads[0].float()
        elif op == "saved_shape":
            i = draw(st.integers(0, 2))
            saved[i] = torch.randn(*draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)), dtype=saved[i].dtype)
        elif op == "saved_dtype":
            i = draw(st.integers(0, 2))
            saved[i] = saved[i].float()
        elif op == "saved_layout" and saved[0].dim() == 3 and min(saved[0].shape) > 1:
            saved[0] = saved[0].transpose(1, 2).contiguous().transpose(1, 2)  # same shape, not contiguous
        elif op == "lengths" and lengths.numel():
            lengths = lengths.clone()
            lengths[draw(st.integers(0, lengths.numel() - 1))] = draw(st.integers(-2, 6))
        elif op == "input_rows" and x.dim() == 2:
            x = torch.cat([x, x[:1]]) if draw(st.booleans()) or x.shape[0] == 0 else x[1:]
    input_grad = draw(st.booleans())
    return (grads[0], grads[1], grads[2], x, lengths, weights, h0, c0, *saved, L, layout, input_grad), touched


def _backward_valid(go, gh, gc, x, lengths, weights, h0, c0, gates, cells, hiddens, L, layout):
    if not _forward_valid(x, lengths, weights, h0, c0, L, layout):
        return False
    H = weights[1].shape[1]
    B = lengths.shape[0]
    M = x.shape[0] * x.shape[1] if layout in (1, 2) else x.shape[0]
    return (tuple(go.shape) == (*x.shape[:-1], H) and go.dtype == x.dtype
            and _states_valid((gh, gc), L, B, H, x.dtype)
            and all(tuple(t.shape) == (L, M, c * H) and t.is_contiguous() and t.dtype == x.dtype
                    for t, c in [(gates, 4), (cells, 1), (hiddens, 1)]))


@settings(SETTINGS, max_examples=100)
@given(_backward_args())
def test_backward_op_result_or_clean_error(case):
    args, touched = case
    go, gh, gc, x, lengths, weights, h0, c0, *_saved, L, layout, input_grad = args
    valid = _backward_valid(*args[:-1])
    result = _outcome(valid, lambda: torch.ops.stfast.lstm_backward(*args))
    if result is None:
        return
    grad_x, grad_w, grad_h0, grad_c0 = result
    if touched:  # valid but other saved values or lengths: a result of the right shapes is all one can ask
        assert len(grad_w) == len(weights)
        return
    leaves = [t.detach().requires_grad_() for t in (x, *weights)]
    states = [None if s is None else s.detach().requires_grad_() for s in (h0, c0)]
    ref = _reference(leaves[0], lengths.tolist(), leaves[1:], L, *states, layout)
    loss = sum((r * gr).sum() for r, gr in zip(ref, (go, gh, gc)) if gr is not None)
    wrt = leaves + [s for s in states if s is not None]
    # B = 0: nothing depends on any leaf (every gradient is zero)
    want = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
    got = ([grad_x] if input_grad else [None]) + list(grad_w) + [g for g, s in zip((grad_h0, grad_c0), states)
                                                                 if s is not None]
    for a, b, leaf in zip(got, want, leaves + [s for s in states if s is not None]):
        if a is None:
            continue
        _close(a, torch.zeros_like(leaf) if b is None else b)
    if not input_grad:
        assert grad_x.numel() == 0


@st.composite
def _csr_case(draw):
    """lstm_packed with arbitrary offsets: a valid CSR vector, then mutations of it."""
    x, lengths, weights, h0, c0, L, _layout = draw(_forward_args(mutate=False))
    lens = lengths.tolist()
    N = sum(lens)
    x = torch.randn(N, weights[0].shape[1], dtype=torch.float64)
    offsets = [0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()]
    dtype = torch.int64
    for op in draw(st.lists(st.sampled_from(["shift", "swap", "value", "drop", "empty", "dtype"]), min_size=1,
                            max_size=2)):
        if op == "shift":
            d = draw(st.integers(-3, 3))
            offsets = [o + d for o in offsets]
        elif op == "swap" and len(offsets) > 2:
            i = draw(st.integers(0, len(offsets) - 2))
            offsets[i], offsets[i + 1] = offsets[i + 1], offsets[i]
        elif op == "value" and offsets:  # (after "empty" there is no entry to change)
            offsets[draw(st.integers(0, len(offsets) - 1))] = draw(st.integers(-4, N + 4) | st.sampled_from(HUGE[:3]))
        elif op == "drop" and len(offsets) > 1:
            offsets.pop(draw(st.integers(0, len(offsets) - 1)))
        elif op == "empty":
            offsets = []
        elif op == "dtype":
            dtype = draw(st.sampled_from([torch.int32, torch.float64, torch.bool]))
    return x, torch.tensor(offsets, dtype=torch.int64).to(dtype), weights, L, h0, c0


@settings(SETTINGS, max_examples=100)
@given(_csr_case())
def test_lstm_packed_offsets_result_or_clean_error(case):
    x, offsets, weights, L, h0, c0 = case
    off = offsets.tolist()
    diffs = [b - a for a, b in zip(off, off[1:])]
    valid = (offsets.dtype in (torch.int64, torch.int32) and len(off) >= 1 and off[0] == 0 and off[-1] == x.shape[0]
             and all(d >= 1 for d in diffs)
             and _states_valid((h0, c0), L, len(diffs), weights[1].shape[1], x.dtype))
    got = _outcome(valid, lambda: lstm_packed(x, offsets, weights, L, h0, c0))
    if got is not None:
        _check_against_reference(got, x, diffs, weights, L, h0, c0, 0)


@st.composite
def _padded_case(draw):
    x, lengths, weights, h0, c0, L, layout = draw(_forward_args(mutate=False))
    batch_first = draw(st.booleans())
    B, I = lengths.shape[0], weights[0].shape[1]
    T = max(lengths.tolist(), default=0) + draw(st.integers(0, 1))
    x = torch.randn(*((B, T, I) if batch_first else (T, B, I)), dtype=torch.float64)
    lens = lengths.tolist()
    kind = draw(st.sampled_from(["value", "float", "count", "value", "tensor", "list", "none"]))
    if kind == "count":
        lens = draw(st.lists(st.integers(1, max(T, 1)), min_size=max(0, B - 1), max_size=B + 1))
    elif kind == "value":
        lens = lens + [1] if not lens else list(lens)
        lens[draw(st.integers(0, len(lens) - 1))] = draw(st.sampled_from([-1, 0, T + 1, *HUGE]))
    lengths = {"list": lens, "none": None, "float": torch.tensor(lens, dtype=torch.float64) + 0.5}.get(
        kind, torch.tensor(lens, dtype=torch.int64))
    return x, weights, L, lengths, h0, c0, batch_first


@settings(SETTINGS, max_examples=100)
@given(_padded_case())
def test_lstm_padded_lengths_result_or_clean_error(case):
    x, weights, L, lengths, h0, c0, batch_first = case
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    if lengths is None:
        lens, ok = [T] * B, True
    else:
        t = torch.as_tensor(lengths)
        ok = (t.numel() == 0 or not t.dtype.is_floating_point) and t.dim() == 1
        lens = t.tolist() if t.dim() == 1 else []
    valid = (ok and len(lens) == B and all(1 <= n <= T for n in lens)
             and _states_valid((h0, c0), L, B, weights[1].shape[1], x.dtype))
    got = _outcome(valid, lambda: lstm_padded(x, weights, L, lengths, h0, c0, batch_first))
    if got is not None:
        _check_against_reference(got, x, lens, weights, L, h0, c0, 1 if batch_first else 2)


@st.composite
def _packed_sequence_case(draw):
    x, lengths, weights, h0, c0, L, _layout = draw(_forward_args(mutate=False))
    lens = sorted(lengths.tolist(), reverse=True)
    batch = [sum(n > t for n in lens) for t in range(max(lens, default=0))]
    rows = sum(lens)
    if draw(st.integers(0, 3)):  # 3 in 4: arbitrary batch sizes
        batch = draw(st.lists(st.integers(-1, 5), max_size=5))
        rows = draw(st.sampled_from([rows, sum(batch), max(0, sum(batch))]))
    data = torch.randn(max(rows, 0), weights[0].shape[1], dtype=torch.float64)
    dtype = draw(st.sampled_from([torch.int64, torch.int64, torch.int32]))
    return data, torch.tensor(batch, dtype=dtype), weights, L, h0, c0


@settings(SETTINGS, max_examples=100)
@given(_packed_sequence_case())
def test_lstm_packed_sequence_result_or_clean_error(case):
    data, batch_sizes, weights, L, h0, c0 = case
    bs = batch_sizes.tolist()
    valid = (batch_sizes.dtype == torch.int64 and all(b >= 1 for b in bs) and sum(bs) == data.shape[0]
             and all(a >= b for a, b in zip(bs, bs[1:])))
    lens = [sum(b > r for b in bs) for r in range(bs[0])] if valid and bs else []
    valid = valid and _states_valid((h0, c0), L, len(lens), weights[1].shape[1], data.dtype)
    got = _outcome(valid, lambda: lstm_packed_sequence(data, batch_sizes, weights, L, h0, c0))
    if got is not None:
        _check_against_reference(got, data, lens, weights, L, h0, c0, 3)


@pytest.mark.parametrize("case", ["B0", "H0", "I0"])
def test_degenerate_sizes_are_valid_by_these_rules(case):
    """The rules above agree with the op on the degenerate sizes (B = 0, H = 0, I = 0 are valid)."""
    I, H, lens = {"B0": (2, 3, []), "H0": (2, 0, [2, 1]), "I0": (0, 3, [2, 1])}[case]
    weights = [torch.randn(4 * H, I, dtype=torch.float64), torch.randn(4 * H, H, dtype=torch.float64)]
    args = (torch.randn(sum(lens), I, dtype=torch.float64), torch.tensor(lens, dtype=torch.int64), weights, None,
            None, 1, 0)
    assert _forward_valid(*args)
    out = torch.ops.stfast.lstm_forward(*args)
    _close(out[0], _reference(args[0], lens, weights, 1, None, None, 0)[0])
