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

    ``forward(x)``: x (..., in_features) → (..., out_features). On a float32 or float64 CPU tensor whose dtype
    has ``"aten"`` as its chosen bulk library (:func:`stfast.ops.gemm_library`; float64 always), and on every
    other device, it is ``torch.nn.functional.linear``, bit for bit. Otherwise the product runs in the chosen
    library (``stfast.ops.gemm.linear``, differentiable): float32 in float32; 16-bit operands (under
    ``torch.autocast("cpu")`` autocast's casts of x and the weight, as for torch's ``linear``, or a 16-bit
    model) always, whichever library is chosen for them with a float32 output (``"aten"``: widened to float32,
    exact products), summed in float32, the bias added in float32, then rounded once to the 16-bit dtype, which
    is also F.linear's output dtype there. Why always: where no 16-bit library beats ATen's widened float32
    GEMM, torch's own 16-bit CPU ``linear`` is slower still (AMD EPYC Zen 3, AVX2: 3.6–5.8 GFLOP/s under
    autocast against 44–71 widened, at the model's shapes). Errors: F.linear's RuntimeError for mismatched
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
        if operands in _HALF:  # whatever library is chosen (ATen: the operands widened, see the class docstring).
            # x cast by stfast::gemm_mm's Autocast kernel (stfast.ops.autocast); the weight here, before its
            # transpose (a view, which a KeptCasts block would cast anew per forward pass). Traced by torch.compile:
            # a plain cast in the graph (a KeptCasts block reads the eager weight's data pointer and version)
            if weight.dtype == operands:
                w = weight
            elif torch.compiler.is_compiling():
                w = weight.to(operands)
            else:
                w = weight_casts.cast(weight, operands)
            return gemm.linear(x, w, bias, out_dtype=torch.float32).to(operands)
        if not _through_chosen_library(operands):
            return F.linear(x, weight, bias)
        return gemm.linear(x, weight, bias)
