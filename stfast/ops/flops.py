"""FLOP counts of stfast's ops for ``torch.utils.flop_counter.FlopCounterMode`` (issue 51, item 5).

Importing this module registers, through torch's own mechanism (``torch.utils.flop_counter.register_flop_formula``),
a formula for each of stfast's compute ops, so that ``FlopCounterMode`` counts a whole training step of the fused
model (forward and backward) as it counts ``aten::mm`` for the reference model; and one for torch's oneDNN LSTM
layer (``aten::mkldnn_rnn_layer`` / ``_backward``, what ``torch.nn.LSTM`` runs on the CPU), which torch's own
registry leaves at 0, so the reference model's count includes its LSTM. Not imported by :mod:`stfast.ops`: torch's
flop counter imports triton where it is installed (~0.2 s), which a plain ``import stfast`` should not pay.

    import stfast.ops.flops  # noqa: F401  (registers the formulas)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        loss = model(batch) ...; loss.backward()
    counter.get_total_flops()

Convention: torch's — a product of (M × K) and (K × N) is 2·M·K·N FLOPs (``flop_counter.mm_flop``), a
convolution 2·(output positions)·C_out·C_in·k (``conv_flop_count``); only matrix products and convolutions count
(gates, activations, bias sums and reductions do not, as for ATen's ops). A counted op's every product counts,
whichever library (``aten`` / ``onednn`` / ``brgemm``, :mod:`stfast.ops.gemm`) runs it.

Formulas (G = 4 gates, H hidden units; per LSTM layer k its input width I_k: I_0 = the input's columns,
I_k = H above; the products are the ones written in :mod:`stfast.ops.lstm`'s docstring):

- ``stfast::lstm_forward``: Σ_k 2·N·G·H·(I_k + H) — per alive position the input projection x_t·W_ihᵀ
  (2·G·H·I_k) and the recurrent product h_{t−1}·W_hhᵀ (2·G·H·H). N = Σ len_b, the positions alive (varlen:
  a padded input's positions past each length are not computed, so not counted); the packed layouts' N is the
  input's rows. Under a fake tensor (tracing) a padded input's lengths cannot be read: every row counts there.
  The count is the math's, as for torch.nn.LSTM: where h0 is zero the kernels skip step 0's recurrent product
  (B rows fewer; ``benchmarks/bench_lstm.py``'s ``gemm_list`` lists the products that run).
- ``stfast::lstm_backward``: Σ_k 2·N·G·H·(2·I_k + 2·H), less 2·N·G·H·I_0 when ``input_grad`` is false — per
  layer dX = dG·W_ih (skipped for layer 0 without ``input_grad``; layers above always need it), dH_{t−1} = dG·W_hh,
  dW_ih = Σ_t dG_tᵀ·x_t and dW_hh = Σ_t dG_tᵀ·h_{t−1}, each over the N alive positions.
- ``stfast::geo_conv_forward``: 2·N·F_in·H (projection) + 2·N_out·C·H·k (convolution): N points, N_out output
  windows (the output's rows), weights ``(H, F_in)`` and ``(C, H, k)`` (:mod:`stfast.ops.geo_conv`).
- ``stfast::geo_conv_backward``: twice that — the points' gradient and the projection weight's (2·N·F_in·H each),
  the hidden activations' gradient and the convolution weight's (2·N_out·C·H·k each).
- ``stfast::gemm_mm``: ``mm_flop`` (2·R·K·C); its backward is two more ``gemm_mm`` calls, counted themselves.
- ``aten::mkldnn_rnn_layer``: 2·R·G·H·(I + H) with R = every row of the (padded) input — oneDNN's RNN computes
  all T·B positions; G = ``weight0``'s rows / H. ``aten::mkldnn_rnn_layer_backward``: 2·R·G·H·(2·I + 2·H)
  (oneDNN's backward computes the input's, the state's and both weights' gradients).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import flop_registry, mm_flop, register_flop_formula

__all__ = ["geo_conv_flops", "lstm_flops", "register"]

# The op's `layout` argument (stfast.ops.lstm): 0 packed CSR and 3 packed time-major have exactly N input rows.
_PACKED_LAYOUTS = (0, 3)


def _alive_positions(input: torch.Tensor, lengths: torch.Tensor, layout: int) -> int:
    """N = Σ len_b of an ``stfast::lstm_forward`` call: the packed input's rows, or the sum of a padded input's
    lengths (every row of it when the lengths are fake, under tracing, where they cannot be read)."""
    rows = input.shape[0] if input.dim() == 2 else input.shape[0] * input.shape[1]
    if layout in _PACKED_LAYOUTS or lengths.numel() == 0:
        return int(rows) if lengths.numel() else 0
    from torch._subclasses.fake_tensor import is_fake
    return int(rows) if is_fake(lengths) else int(lengths.sum())


def lstm_flops(positions: int, input_size: int, hidden_size: int, num_layers: int, backward: bool = False,
               input_grad: bool = True, gates: int = 4) -> int:
    """FLOPs of a multi-layer LSTM's matrix products over ``positions`` alive positions (module docstring):
    forward Σ_k 2·N·G·H·(I_k + H); backward Σ_k 2·N·G·H·(2·I_k + 2·H), less layer 0's dX without
    ``input_grad``."""
    total = 0
    for k in range(num_layers):
        i_k = input_size if k == 0 else hidden_size
        if not backward:
            total += 2 * positions * gates * hidden_size * (i_k + hidden_size)
        else:
            dx = i_k if (k > 0 or input_grad) else 0
            total += 2 * positions * gates * hidden_size * (dx + i_k + 2 * hidden_size)
    return total


def geo_conv_flops(points: int, windows: int, in_features: int, hidden: int, channels: int, kernel_size: int,
                   backward: bool = False) -> int:
    """FLOPs of the geo-conv's products (module docstring): 2·N·F_in·H + 2·N_out·C·H·k forward, twice that
    backward."""
    forward = 2 * points * in_features * hidden + 2 * windows * channels * hidden * kernel_size
    return 2 * forward if backward else forward


def _lstm_shape(weights) -> tuple[int, int]:
    """(I_0, H) of an LSTM call from its weights (torch.nn.LSTM's order: w_ih (4H, I_0), w_hh (4H, H), ...)."""
    return int(weights[0].shape[1]), int(weights[1].shape[1])


def _lstm_forward_flop(input, lengths, weights, h0, c0, num_layers, layout, *, out_val=None) -> int:
    i0, h = _lstm_shape(weights)
    return lstm_flops(_alive_positions(input, lengths, layout), i0, h, num_layers)


def _lstm_backward_flop(grad_output, grad_h_n, grad_c_n, input, lengths, weights, h0, c0, gates, cells, hiddens,
                        num_layers, layout, input_grad=True, *, out_val=None) -> int:
    i0, h = _lstm_shape(weights)
    return lstm_flops(_alive_positions(input, lengths, layout), i0, h, num_layers, backward=True,
                      input_grad=bool(input_grad))


def _geo_conv_flop(points_shape, proj_weight_shape, conv_weight_shape, out_shape, backward: bool) -> int:
    c, h, k = conv_weight_shape
    return geo_conv_flops(points_shape[0], out_shape[0], proj_weight_shape[1], h, c, k, backward)


def _geo_conv_forward_flop(points, offsets, local_dist, proj_weight, proj_bias, conv_weight, conv_bias, *,
                           out_shape=None) -> int:
    return _geo_conv_flop(points, proj_weight, conv_weight, out_shape[0], backward=False)


def _geo_conv_backward_flop(grad_out, points, offsets, hidden, out, proj_weight, conv_weight, *args,
                            out_shape=None) -> int:
    return _geo_conv_flop(points, proj_weight, conv_weight, grad_out, backward=True)


def _gemm_mm_flop(a, b, out_dtype=None, *, out_shape=None) -> int:
    return mm_flop(a, b)


def _onednn_rnn_flop(input, w_ih, w_hh, hidden_size: int, backward: bool) -> int:
    rows = input.numel() // input.shape[-1] if input.numel() else 0  # T·B: every padded position
    gates = int(w_ih.shape[0]) // hidden_size if hidden_size else 0
    return lstm_flops(int(rows), int(w_ih.shape[1]), hidden_size, 1, backward=backward, gates=gates)


def _mkldnn_rnn_layer_flop(input, weight0, weight1, weight2, weight3, hx_, cx_, reverse, batch_sizes, mode,
                           hidden_size, *args, **kwargs) -> int:
    return _onednn_rnn_flop(input, weight0, weight1, hidden_size, backward=False)


def _mkldnn_rnn_layer_backward_flop(input, weight1, weight2, weight3, weight4, hx_, cx_tmp, output, hy_, cy_,
                                    grad_output, grad_hy, grad_cy, reverse, mode, hidden_size, *args,
                                    **kwargs) -> int:
    return _onednn_rnn_flop(input, weight1, weight2, hidden_size, backward=True)


def register() -> None:
    """Register the formulas above with torch's flop counter, each where its op has none yet (idempotent; an
    ATen formula torch itself ships is kept). Run when this module is imported; a ``FlopCounterMode`` made
    afterwards counts the ops (it copies the registry when constructed)."""
    from .. import _C  # noqa: F401  (the stfast ops must exist)

    stfast, aten = torch.ops.stfast, torch.ops.aten
    formulas = ((stfast.lstm_forward, _lstm_forward_flop, True), (stfast.lstm_backward, _lstm_backward_flop, True),
                (stfast.geo_conv_forward, _geo_conv_forward_flop, False),
                (stfast.geo_conv_backward, _geo_conv_backward_flop, False), (stfast.gemm_mm, _gemm_mm_flop, False),
                (aten.mkldnn_rnn_layer, _mkldnn_rnn_layer_flop, True),
                (aten.mkldnn_rnn_layer_backward, _mkldnn_rnn_layer_backward_flop, True))
    for op, formula, raw in formulas:
        if op not in flop_registry:
            register_flop_formula(op, get_raw=raw)(formula)


register()
