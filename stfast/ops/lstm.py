"""The fused variable-length multi-layer LSTM op: ``torch.ops.stfast.lstm_forward`` / ``lstm_backward``.

The math is torch.nn.LSTM's (Hochreiter & Schmidhuber 1997, with the forget gate of Gers et al. 2000;
gate order i, f, g, o as in the PyTorch docs), layer by layer, for every sequence b and step t < len_b:

    gates = x_t W_ihᵀ + b_ih + h_{t−1} W_hhᵀ + b_hh          (4H: i, f, g, o)
    i, f, o = σ(·),  g = tanh(·)
    c_t = f ⊙ c_{t−1} + i ⊙ g,   h_t = o ⊙ tanh(c_t)

with h_{−1} = h0, c_{−1} = c0 (zeros when not given); layer k > 0 reads layer k − 1's h. Weights are
torch.nn.LSTM's, in its order: per layer ``weight_ih_l{k}`` (4H, I_k), ``weight_hh_l{k}`` (4H, H), then
``bias_ih_l{k}`` (4H,) and ``bias_hh_l{k}`` (4H,) when there are biases.

Layouts (B sequences, T padded length, N = Σ len_b valid positions, I input size, H hidden size):
- packed (CSR, sequence-major): input ``(N, I)`` with ``offsets`` ``(B + 1,)`` — the layout the geo-conv
  op emits; output ``(N, H)`` in the same rows.
- padded ``(B, T, I)`` (``batch_first``) or ``(T, B, I)`` with ``lengths`` ``(B,)``: output in the same
  layout, zero past each length (as ``pad_packed_sequence``).
Sequence lengths live on the host (CPU int64, like PackedSequence.batch_sizes): the kernels size one
recurrent GEMM per step from them, so a CUDA call never waits on the device to read them.

How it runs (csrc/lstm/): per layer ONE GEMM for the input projection of all N positions; then per step
t one recurrent GEMM over the sequences still alive (sorted by length, longest first, so they are a
prefix — the active batch shrinks as short trips end, as in PyTorch's PackedLayer) and one fused
pointwise pass for gates, cell and hidden state. Backward mirrors it through time; weight and bias
gradients are whole-sequence GEMMs and sums (deterministic, no atomics).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .fake import refuse_mixed_meta

__all__ = ["lstm_packed", "lstm_packed_sequence", "lstm_padded", "lstm_reference", "offsets_to_lengths"]

# The op's `layout` argument (csrc/lstm/lstm_driver.h, enum Layout).
LAYOUT_PACKED_CSR, LAYOUT_PADDED_BATCH_FIRST, LAYOUT_PADDED_TIME_FIRST, LAYOUT_PACKED_TIME_MAJOR = 0, 1, 2, 3


def _check_weights(weights, num_layers: int) -> bool:
    """True when ``weights`` carry biases (4 tensors per layer), False for 2; else ValueError."""
    if len(weights) == 4 * num_layers:
        return True
    if len(weights) == 2 * num_layers:
        return False
    raise ValueError(f"stfast.lstm: weights must hold 4 (with biases) or 2 tensors per layer for "
                     f"num_layers={num_layers}, got {len(weights)}")


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def offsets_to_lengths(offsets: Tensor) -> Tensor:
    """CSR offsets ``(B + 1,)`` integer → lengths ``(B,)`` int64 on the CPU (a device copy when offsets live on
    a GPU). ValueError unless offsets are 1-D, integer and start at 0 (checked on the host copy, on every
    device; under torch.compile the start is not read). Decreasing offsets give a length < 1, which the op
    rejects."""
    if offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError(f"stfast.lstm: offsets must be (B + 1,), got shape {tuple(offsets.shape)}")
    if not _is_integer(offsets.dtype):
        raise ValueError(f"stfast.lstm: offsets must be an integer tensor, got {offsets.dtype}")
    host = offsets.to(device="cpu", dtype=torch.int64)
    if not torch.compiler.is_compiling() and int(host[0]) != 0:
        raise ValueError(f"stfast.lstm: offsets must start at 0, got {int(host[0])}")
    return host.diff()


def _host_lengths(lengths, B: int) -> Tensor:
    """Per-sequence lengths (a tensor or a sequence of ints) → ``(B,)`` int64 on the CPU; ValueError for a
    non-integer dtype (a float length would be truncated silently; an empty [] is fine) or a wrong count."""
    lengths = torch.as_tensor(lengths)
    if lengths.numel() and not _is_integer(lengths.dtype):
        raise ValueError(f"stfast.lstm: lengths must be integers, got {lengths.dtype}")
    if lengths.dim() != 1 or lengths.shape[0] != B:
        raise ValueError(f"stfast.lstm: lengths must be ({B},) for {B} sequences, got shape {tuple(lengths.shape)}")
    return lengths.to(device="cpu", dtype=torch.int64)


def lstm_reference(input: Tensor, offsets: Tensor, weights: list[Tensor], num_layers: int,
                   h0: Tensor | None = None, c0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Plain-PyTorch reference of :func:`lstm_packed` (same arguments and results), written out gate by
    gate with a step loop over a padded copy; each sequence's state freezes after its own last step."""
    has_bias = _check_weights(weights, num_layers)
    lengths = offsets.diff().tolist()
    B = len(lengths)
    H = weights[1].shape[1]
    T = max(lengths, default=0)
    x = torch.nn.utils.rnn.pad_sequence(list(torch.split(input, lengths)), batch_first=True) if B else \
        input.new_zeros(0, 0, input.shape[1])
    alive = torch.arange(T, device=input.device)[None, :] < torch.tensor(lengths, device=input.device)[:, None]
    per = 4 if has_bias else 2
    h_n, c_n = [], []
    for k in range(num_layers):
        w_ih, w_hh = weights[per * k], weights[per * k + 1]
        h = h0[k] if h0 is not None else x.new_zeros(B, H)
        c = c0[k] if c0 is not None else x.new_zeros(B, H)
        proj = x @ w_ih.t()
        if has_bias:
            proj = proj + weights[per * k + 2] + weights[per * k + 3]
        outs = []
        for t in range(T):
            gates = proj[:, t] + h @ w_hh.t()
            i, f, g, o = gates.chunk(4, dim=1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            m = alive[:, t, None]
            h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
            outs.append(h_new)
        x = torch.stack(outs, 1) if outs else x.new_zeros(B, 0, H)
        h_n.append(h)
        c_n.append(c)
    return x[alive], torch.stack(h_n), torch.stack(c_n)


def lstm_packed(input: Tensor, offsets: Tensor, weights: list[Tensor], num_layers: int, h0: Tensor | None = None,
                c0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Fused multi-layer LSTM over packed (CSR) sequences.

    Args:
        input: ``(N, I)`` float, all B sequences back to back (sequence-major).
        offsets: ``(B + 1,)`` integer CSR offsets of the sequences in ``input`` (``offsets[0] = 0``); any device
            (read on the host: a copy, hence a sync, when they live on a GPU — pass CPU offsets to avoid it).
        weights: torch.nn.LSTM's parameters in its order: per layer ``weight_ih`` ``(4H, I_k)``, ``weight_hh``
            ``(4H, H)``, then (optional, all layers alike) ``bias_ih``, ``bias_hh`` ``(4H,)``.
        num_layers: L (the number of layers in ``weights``).
        h0, c0: optional ``(L, B, H)`` initial hidden and cell states (zeros when None).
    Returns:
        output ``(N, H)`` (the last layer's hidden state at every position, same rows as ``input``),
        h_n and c_n ``(L, B, H)``: every layer's state at each sequence's own last step.
    Raises:
        ValueError: offsets not starting at 0 or not integer, a length < 1, lengths not summing to N,
            weights/states of the wrong count or shape (the op's checks, the same on every device).
        RuntimeError: mixed dtypes/devices; an unsupported dtype; a CUDA tensor in a CPU-only build.
    dtypes: float32/float64/float16/bfloat16 on the CPU and CUDA; float16/bfloat16 accumulate in float32
    (pre-activations, cell state, hidden-state gradient), each stored value rounded once.
    Degenerate sizes are valid: B = 0 (offsets ``[0]``, N = 0), H = 0 and I = 0 give empty or zero results.
    """
    _check_weights(weights, num_layers)
    out, h_n, c_n, *_ = torch.ops.stfast.lstm_forward(input, offsets_to_lengths(offsets), list(weights), h0, c0,
                                                      num_layers, LAYOUT_PACKED_CSR)
    return out, h_n, c_n


def lstm_padded(input: Tensor, weights: list[Tensor], num_layers: int, lengths: Tensor | None = None,
                h0: Tensor | None = None, c0: Tensor | None = None,
                batch_first: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Fused multi-layer LSTM over padded sequences.

    Args:
        input: ``(T, B, I)``, or ``(B, T, I)`` with ``batch_first``.
        lengths: ``(B,)`` integer lengths in 1..T (a tensor on any device, read on the host, or a sequence of
            ints), or None: every sequence runs all T steps (torch.nn.LSTM on a padded tensor).
        weights, num_layers, h0, c0: as :func:`lstm_packed`.
    Returns:
        output in ``input``'s layout with H columns, zero past each sequence's length (as
        ``pad_packed_sequence``); h_n, c_n ``(L, B, H)`` at each sequence's own last step.
    Raises:
        ValueError: a length outside 1..T, non-integer lengths or not B of them, or as :func:`lstm_packed`.
    """
    _check_weights(weights, num_layers)
    if input.dim() != 3:
        raise ValueError(f"stfast.lstm: padded input must be 3-D, got shape {tuple(input.shape)}")
    B, T = (input.shape[0], input.shape[1]) if batch_first else (input.shape[1], input.shape[0])
    lengths = torch.full((B,), T, dtype=torch.int64) if lengths is None else _host_lengths(lengths, B)
    layout = LAYOUT_PADDED_BATCH_FIRST if batch_first else LAYOUT_PADDED_TIME_FIRST
    out, h_n, c_n, *_ = torch.ops.stfast.lstm_forward(input, lengths, list(weights), h0, c0, num_layers, layout)
    return out, h_n, c_n


def lstm_packed_sequence(data: Tensor, batch_sizes: Tensor, weights: list[Tensor], num_layers: int,
                         h0: Tensor | None = None, c0: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Fused multi-layer LSTM over PyTorch's packed layout (``PackedSequence.data`` ``(N, I)`` and
    ``batch_sizes`` ``(T,)`` int64 on the CPU), in its sorted order: h0/c0 and the returned h_n/c_n
    ``(L, B, H)`` index sequences by rank (``sorted_indices`` maps them back). Output ``(N, H)`` in the
    same rows as ``data``; no reordering copies beyond the op's own.

    Raises:
        ValueError: batch_sizes not a 1-D int64 CPU tensor of positive, non-increasing counts (what
            pack_padded_sequence makes), or as :func:`lstm_packed`.
    """
    _check_weights(weights, num_layers)
    if batch_sizes.dim() != 1 or batch_sizes.dtype != torch.int64 or batch_sizes.device.type != "cpu":
        raise ValueError(f"stfast.lstm: batch_sizes must be a 1-D int64 CPU tensor (PackedSequence.batch_sizes), "
                         f"got {batch_sizes.dtype} {tuple(batch_sizes.shape)} on {batch_sizes.device}")
    if batch_sizes.numel() and not torch.compiler.is_compiling() and (
            int(batch_sizes[-1]) < 1 or bool((batch_sizes[1:] > batch_sizes[:-1]).any())):
        raise ValueError(f"stfast.lstm: batch_sizes must be positive and non-increasing, got {batch_sizes.tolist()}")
    if not torch.compiler.is_compiling() and int(batch_sizes.sum()) != data.shape[0]:
        raise ValueError(f"stfast.lstm: batch_sizes sum to {int(batch_sizes.sum())} but data has {data.shape[0]} rows")
    B = int(batch_sizes[0]) if batch_sizes.numel() else 0
    lengths = (batch_sizes[None, :] > torch.arange(B)[:, None]).sum(1)
    out, h_n, c_n, *_ = torch.ops.stfast.lstm_forward(data, lengths, list(weights), h0, c0, num_layers,
                                                      LAYOUT_PACKED_TIME_MAJOR)
    return out, h_n, c_n


# --- torch.library registrations (fake kernels for tracing, autograd through the backward op) ---

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@torch.library.register_fake("stfast::lstm_forward")
def _lstm_forward_fake(input, lengths, weights, h0, c0, num_layers, layout):
    refuse_mixed_meta("stfast.lstm", ("lengths",), input=input, lengths=lengths, weights=weights, h0=h0, c0=c0)
    torch._check(input.dim() in (2, 3))
    H = weights[1].shape[1]
    B = lengths.shape[0]
    M = input.shape[0] if input.dim() == 2 else input.shape[0] * input.shape[1]
    L = num_layers
    return (input.new_empty(*input.shape[:-1], H), input.new_empty(L, B, H), input.new_empty(L, B, H),
            input.new_empty(L, M, 4 * H), input.new_empty(L, M, H, dtype=_acc_dtype(input.dtype)),
            input.new_empty(L, M, H))


@torch.library.register_fake("stfast::lstm_backward")
def _lstm_backward_fake(grad_output, grad_h_n, grad_c_n, input, lengths, weights, h0, c0, gates, cells, hiddens,
                        num_layers, layout, input_grad=True):
    refuse_mixed_meta("stfast.lstm_backward", ("lengths",), grad_output=grad_output, grad_h_n=grad_h_n,
                      grad_c_n=grad_c_n, input=input, lengths=lengths, weights=weights, h0=h0, c0=c0, gates=gates,
                      cells=cells, hiddens=hiddens)
    H = weights[1].shape[1]
    B = lengths.shape[0]
    # contiguous, as the kernels return them (empty_like would copy a transposed input's strides)
    return (input.new_empty(input.shape) if input_grad else input.new_empty(0), [w.new_empty(w.shape) for w in weights],
            input.new_empty(num_layers, B, H), input.new_empty(num_layers, B, H))


def _setup_context(ctx, inputs, output):
    input, lengths, weights, h0, c0, num_layers, layout = inputs
    _out, _h_n, _c_n, gates, cells, hiddens = output
    ctx.mark_non_differentiable(gates, cells, hiddens)
    # Why: autograd would otherwise build zero gradients for the saved workspaces (L·M·6H values, several
    # times the output) on every backward; undefined grads reach the op as None.
    ctx.set_materialize_grads(False)
    ctx.n_weights = len(weights)
    ctx.num_layers, ctx.layout = num_layers, layout
    ctx.has_h0, ctx.has_c0 = h0 is not None, c0 is not None
    ctx.save_for_backward(input, lengths, h0, c0, gates, cells, hiddens, *weights)


def _backward(ctx, grad_output, grad_h_n, grad_c_n, _g, _c, _h):
    input, lengths, h0, c0, gates, cells, hiddens, *weights = ctx.saved_tensors
    if grad_output is None and grad_h_n is None and grad_c_n is None:
        return (None, None, [None] * ctx.n_weights, None, None, None, None)
    if grad_output is None:
        grad_output = input.new_zeros(*input.shape[:-1], weights[1].shape[1])
    grad_input, grad_weights, grad_h0, grad_c0 = torch.ops.stfast.lstm_backward(
        grad_output.contiguous(), grad_h_n, grad_c_n, input, lengths, weights, h0, c0, gates, cells, hiddens,
        ctx.num_layers, ctx.layout, ctx.needs_input_grad[0])
    return (grad_input if ctx.needs_input_grad[0] else None, None, list(grad_weights),
            grad_h0 if ctx.has_h0 else None, grad_c0 if ctx.has_c0 else None, None, None)


torch.library.register_autograd("stfast::lstm_forward", _backward, setup_context=_setup_context)
