"""The fused geo-convolution op: ``torch.ops.stfast.geo_conv_forward`` / ``geo_conv_backward``.

DeepTTE's spatio-temporal front (Wang et al., AAAI 2018), per trip of L points with features x
(F_in = 4: normalized lng, lat and the 2-d state embedding):

    h = tanh(x W1ᵀ + b1)                     (L, H = 16)
    z = Conv1d(h, W2, b2, k, no padding)     (L − k + 1, C = 32)
    out = [elu(z), local_dist]               (L − k + 1, C + 1)

Layouts: packed (CSR) points ``(N, F_in)`` with ``offsets`` ``(B + 1,)`` int64 → packed output
``(N − B·(k − 1), C + 1)`` whose offsets are :func:`output_offsets`; and padded ``(B, L, F_in)``
(optionally with ``lengths``) → ``(B, L − k + 1, C + 1)``.

Where the fusion ends: the op covers projection, tanh, convolution, ELU and the local-distance
channel, i.e. everything per point and per window, writing the ``(·, C + 1)`` rows the LSTM reads
in one pass; the hidden activations are kept for the backward (16 values per point, cheaper than
recomputing tanh). Left outside: the 2-row state embedding lookup (a gather that autograd already
handles; its gradient arrives through the points' gradient) and the broadcast of the trip
attributes onto every step. That broadcast is not worth writing at all: the LSTM's input projection
of a per-trip constant is one (B, A) × (A, 4H) product per trip, which the fused LSTM can add to
every step instead of multiplying A = 28 broadcast columns at each of the N positions.

Determinism: weight and bias gradients are summed per fixed chunk (trips on the CPU, tiles of rows
on CUDA) into a partials buffer and reduced in a second pass in chunk order; no float atomics.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .fake import refuse_mixed_meta

__all__ = ["geo_conv_packed", "geo_conv_padded", "geo_conv_reference", "output_offsets", "padded_offsets"]


def output_offsets(offsets: Tensor, kernel_size: int) -> Tensor:
    """Offsets ``(B + 1,)`` of the packed output rows: ``offsets[b] − b·(k − 1)``."""
    return offsets - torch.arange(offsets.shape[0], device=offsets.device, dtype=offsets.dtype) * (kernel_size - 1)


def padded_offsets(batch: int, length: int, device=None) -> Tensor:
    """Offsets ``(B + 1,)`` int64 of B trips of ``length`` points each (the padded layout, flattened);
    on the CPU unless ``device`` is given (the ops read offsets on the host)."""
    return torch.arange(batch + 1, device=device, dtype=torch.int64) * length


def _host(t: Tensor) -> Tensor:
    """``t`` on the CPU (one device-to-host copy, a stream sync, when it lives on a GPU)."""
    return t.to(device="cpu")


def _upload(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor on ``device`` without a sync: on CUDA a non-blocking copy staged through pinned memory."""
    if device.type == "cuda" and not torch.compiler.is_compiling():
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)


def geo_conv_packed(points: Tensor, offsets: Tensor, local_dist: Tensor, proj_weight: Tensor, proj_bias: Tensor,
                    conv_weight: Tensor, conv_bias: Tensor) -> Tensor:
    """Fused geo-convolution over packed trips.

    Args:
        points: ``(N, F_in)`` float point features (all B trips back to back).
        offsets: ``(B + 1,)`` int64 CSR offsets of the trips in ``points``: ``offsets[0] = 0``,
            ``offsets[B] = N``, every trip ≥ k points. Host data: pass the CPU copy (the op checks it
            there before launching anything, for every device); a GPU tensor is copied to the host
            first, which syncs its stream.
        local_dist: ``(N − B·(k − 1),)`` normalized distance of each output window.
        proj_weight ``(H, F_in)``, proj_bias ``(H,)``, conv_weight ``(C, H, k)``, conv_bias ``(C,)``:
            same dtype and device as ``points``. Any size may be 0 (B = N = 0, C, H or F_in = 0).
    Returns:
        ``(N − B·(k − 1), C + 1)``: ELU(conv) channels, then ``local_dist``; trip b's rows start at
        ``output_offsets(offsets, k)[b]``.
    Raises:
        ValueError: offsets that do not cut ``points`` into trips of ≥ k points (offsets[0] ≠ 0, a
            decreasing entry, a trip shorter than k, offsets[B] ≠ N). The same check and message on
            every device (csrc/geo_conv/geo_conv_checks.h).
        RuntimeError: bad shapes / dtypes / devices; a CUDA tensor with a CPU-only build
            ("stfast was built without CUDA support").
    dtypes: float32/float64, float16/bfloat16 (float32 accumulation), on the CPU and CUDA.
    """
    offsets = _host(offsets)
    out, _ = torch.ops.stfast.geo_conv_forward(points, offsets, local_dist, proj_weight, proj_bias, conv_weight,
                                               conv_bias)
    return out


def geo_conv_padded(points: Tensor, local_dist: Tensor, proj_weight: Tensor, proj_bias: Tensor, conv_weight: Tensor,
                    conv_bias: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Fused geo-convolution over padded trips.

    Args:
        points: ``(B, L, F_in)``; local_dist: ``(B, L − k + 1)``; weights as :func:`geo_conv_packed`.
        lengths: ``(B,)`` integer trip lengths (points) in [k, L], a tensor or a sequence, or None: every
            trip uses all L points, which reproduces the reference module exactly, padding included. Host
            data: pass the CPU copy (checked there; no sync at all); a GPU tensor is copied to the host
            once, which syncs its stream.
    Returns:
        ``(B, L − k + 1, C + 1)``. With ``lengths``, only each trip's ``lengths[b] − k + 1`` rows are
        computed (work scales with real points) and the rows past them are zero.
    Raises:
        ValueError: L < k, local_dist not (B, L − k + 1), lengths not (B,) integers, or a length < k or > L
            (checked on the host copy, whatever device ``lengths`` is on).
    """
    if points.dim() != 3:
        raise ValueError(f"stfast.geo_conv: padded points must be (B, L, F_in), got {tuple(points.shape)}")
    B, L, Fin = points.shape
    k = conv_weight.shape[2] if conv_weight.dim() == 3 else 1
    if L < k:
        raise ValueError(f"stfast.geo_conv: padded length {L} < kernel_size={k}")
    Lo = L - k + 1
    if tuple(local_dist.shape) != (B, Lo):
        raise ValueError(f"stfast.geo_conv: local_dist must be (B, L − k + 1) = ({B}, {Lo}), got "
                         f"{tuple(local_dist.shape)}")
    if lengths is None:
        out = geo_conv_packed(points.reshape(B * L, Fin), padded_offsets(B, L), local_dist.reshape(B * Lo),
                              proj_weight, proj_bias, conv_weight, conv_bias)
        return out.view(B, Lo, out.shape[1])  # not -1: B = 0 leaves it undetermined
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.shape != (B,) or lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"stfast.geo_conv: lengths must be (B={B},) integers, got {lengths.dtype} "
                         f"{tuple(lengths.shape)}")
    lengths = _host(lengths).long()
    # Eagerly a specific message here; traced (torch.compile), the op's own check of the offsets built below
    # still rejects every bad length at run time (a trip < k, or offsets[B] != N when a length exceeds L).
    if B and not torch.compiler.is_compiling() and (int(lengths.min()) < k or int(lengths.max()) > L):
        raise ValueError(f"stfast.geo_conv: every length must lie in [kernel_size={k}, L={L}], got "
                         f"min {int(lengths.min())}, max {int(lengths.max())}")
    # Row indices of the real points and windows in the flattened padded layout, computed on the host
    # and uploaded without a sync (boolean-mask indexing on the GPU would sync twice to size its output).
    point_rows = (torch.arange(L)[None, :] < lengths[:, None]).flatten().nonzero().squeeze(1)
    out_rows = (torch.arange(Lo)[None, :] < (lengths - (k - 1))[:, None]).flatten().nonzero().squeeze(1)
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    point_rows, out_rows = _upload(point_rows, points.device), _upload(out_rows, points.device)
    out = geo_conv_packed(points.reshape(B * L, Fin).index_select(0, point_rows), offsets,
                          local_dist.reshape(B * Lo).index_select(0, out_rows), proj_weight, proj_bias, conv_weight,
                          conv_bias)
    return out.new_zeros(B * Lo, out.shape[1]).index_copy(0, out_rows, out).view(B, Lo, out.shape[1])


def geo_conv_reference(points: Tensor, offsets: Tensor, local_dist: Tensor, proj_weight: Tensor, proj_bias: Tensor,
                       conv_weight: Tensor, conv_bias: Tensor) -> Tensor:
    """Plain-PyTorch reference of :func:`geo_conv_packed` (same arguments and result): pads the trips and
    applies the math of :class:`stfast.models.deeptte.GeoConv` (Linear → tanh → Conv1d → ELU). Degenerate
    sizes that Conv1d rejects or mis-shapes follow the same math: no trips → no rows; C = 0 or H = 0 → the
    convolution is its bias (a sum over no channels). Checks only what it needs (a trip shorter than k:
    ValueError); validation proper is the op's."""
    lengths = offsets.diff().tolist()
    k = conv_weight.shape[2]
    if min(lengths, default=k) < k:
        raise ValueError(f"stfast.geo_conv: a trip has {min(lengths)} points, fewer than kernel_size={k}")
    C, H = conv_weight.shape[:2]
    n_out = sum(n - k + 1 for n in lengths)
    if not lengths or C == 0 or H == 0:
        rows = F.elu(conv_bias.expand(n_out, C))
    else:
        x = torch.nn.utils.rnn.pad_sequence(list(torch.split(points, lengths)), batch_first=True)
        h = torch.tanh(F.linear(x, proj_weight, proj_bias))
        z = F.elu(F.conv1d(h.transpose(1, 2), conv_weight, conv_bias)).transpose(1, 2)
        rows = torch.cat([z[b, : n - k + 1] for b, n in enumerate(lengths)])
    return torch.cat([rows, local_dist.unsqueeze(-1)], dim=-1)


# --- torch.library registrations (fake kernels for tracing, autograd through the backward op) ---

@torch.library.register_fake("stfast::geo_conv_forward")
def _geo_conv_forward_fake(points, offsets, local_dist, proj_weight, proj_bias, conv_weight, conv_bias):
    refuse_mixed_meta("stfast.geo_conv", ("offsets",), points=points, offsets=offsets, local_dist=local_dist,
                      proj_weight=proj_weight, proj_bias=proj_bias, conv_weight=conv_weight, conv_bias=conv_bias)
    torch._check(points.dim() == 2 and offsets.dim() == 1)
    n_out = points.shape[0] - (offsets.shape[0] - 1) * (conv_weight.shape[2] - 1)
    return (points.new_empty(n_out, conv_weight.shape[0] + 1), points.new_empty(points.shape[0], proj_weight.shape[0]))


@torch.library.register_fake("stfast::geo_conv_backward")
def _geo_conv_backward_fake(grad_out, points, offsets, hidden, out, proj_weight, conv_weight):
    refuse_mixed_meta("stfast.geo_conv_backward", ("offsets",), grad_out=grad_out, points=points, offsets=offsets,
                      hidden=hidden, out=out, proj_weight=proj_weight, conv_weight=conv_weight)
    # contiguous, as the kernels return them (empty_like would copy a transposed input's strides)
    return (points.new_empty(points.shape), proj_weight.new_empty(proj_weight.shape),
            proj_weight.new_empty(proj_weight.shape[0]), conv_weight.new_empty(conv_weight.shape),
            conv_weight.new_empty(conv_weight.shape[0]))


def _setup_context(ctx, inputs, output):
    points, offsets, _local_dist, proj_weight, _proj_bias, conv_weight, _conv_bias = inputs
    out, hidden = output
    ctx.mark_non_differentiable(hidden)
    ctx.save_for_backward(points, offsets, hidden, out, proj_weight, conv_weight)


def _backward(ctx, grad_out, _grad_hidden):
    points, offsets, hidden, out, proj_weight, conv_weight = ctx.saved_tensors
    if grad_out is None:
        return None, None, None, None, None, None, None
    gx, gw1, gb1, gw2, gb2 = torch.ops.stfast.geo_conv_backward(grad_out.contiguous(), points, offsets, hidden, out,
                                                                proj_weight, conv_weight)
    return gx, None, grad_out[:, -1], gw1, gb1, gw2, gb2


torch.library.register_autograd("stfast::geo_conv_forward", _backward, setup_context=_setup_context)
