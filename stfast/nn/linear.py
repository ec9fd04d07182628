"""``stfast.nn.Linear``: torch.nn.Linear whose CPU product runs in the GEMM library chosen (:mod:`stfast.ops.gemm`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import gemm, weight_casts

_HALF = (torch.float16, torch.bfloat16)


@torch.compiler.assume_constant_result
def _through_chosen_library(operands: torch.dtype) -> bool:
    """Whether the bulk library chosen for ``operands`` (16-bit: with a float32 output) is not ATen's; under
    torch.compile read once, when the graph is traced."""
    return gemm.bulk_library(operands, torch.float32 if operands in _HALF else operands) != "aten"


class Linear(nn.Linear):
    """torch.nn.Linear with the same constructor, parameters (``weight`` (out, in), ``bias`` (out,)), state-dict
    keys and initialization, so checkpoints load both ways and a seed gives the same weights; only where the
    CPU product runs changes.

    ``forward(x)``: x (..., in_features) → (..., out_features). On a CPU tensor whose operand dtype (x's, or
    under ``torch.autocast("cpu")`` autocast's 16-bit dtype, as for torch's ``linear``) has ``"aten"`` as its
    chosen bulk library (:func:`stfast.ops.gemm_library`; float64 always), and on every other device, it is
    ``torch.nn.functional.linear``, bit for bit. Otherwise the product runs in the chosen library
    (``stfast.ops.gemm.linear``, differentiable): float32 in float32; 16-bit operands (autocast's casts of x
    and the weight, or a 16-bit model) summed in float32, the bias added in float32, then rounded once to the
    16-bit dtype, which is also F.linear's output dtype there. Errors: F.linear's RuntimeError for mismatched
    dtypes; for an x whose last dimension is not in_features, F.linear's RuntimeError, or on the library path
    stfast.gemm_mm's ValueError."""

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias  # read once: a module attribute costs a lookup each time
        if not x.is_cpu:
            return F.linear(x, weight, bias)
        operands = x.dtype
        if torch.is_autocast_enabled("cpu") and x.is_floating_point() and operands != torch.float64:
            operands = torch.get_autocast_dtype("cpu")  # what autocast's linear casts x and the weight to
        elif operands != weight.dtype:
            return F.linear(x, weight, bias)  # its own dtype error
        if not _through_chosen_library(operands):
            return F.linear(x, weight, bias)
        if operands in _HALF:  # x cast by stfast::gemm_mm's Autocast kernel (stfast.ops.autocast); the weight here,
            # before its transpose (a view, which a KeptCasts block would cast anew per forward pass)
            w = weight_casts.cast(weight, operands) if weight.dtype != operands else weight
            return gemm.linear(x, w, bias, out_dtype=torch.float32).to(operands)
        return gemm.linear(x, weight, bias)
