"""Which CPU GEMM library a run uses, decided once and kept with the run (issue 44).

stfast's fused kernels choose their GEMM library (:mod:`stfast.ops.gemm`: ``aten`` — MKL / OpenBLAS — or
``onednn``) by timing both at first use. Float32 products of the two differ in their last bits, so a choice
that flipped between a run and its ``--resume`` (a load burst during the probe), between ranks, or between
training and ``evaluate`` would break what is exact today: resume bitwise after kill -9, every rank the same
numbers, evaluate equal to the run's test metrics. So the run decides once — rank 0 probes, every rank takes
its answer — records the plan in its checkpoints, and a resumed run, ``evaluate``, ``predict``, ``eta`` and
``serve`` apply the recorded plan instead of probing again.

A plan is ``{"float32->float32": "onednn", "bfloat16->float32": "onednn", ...}``: operand dtype -> output
dtype, one entry per pair the run's precision uses; float64 (precision 64) has only ``aten`` and no entry.
"""
from __future__ import annotations

import numpy as np
import torch

from ..ops import gemm
from ..parallel import data_parallel as dp

# the (operand, output) dtype pairs a precision's CPU GEMMs use: the fused LSTM's products, and in bf16-mixed
# its bfloat16 operands with float32 and bfloat16 outputs
PAIRS = {"32": ((torch.float32, torch.float32),),
         "64": (),
         "bf16-mixed": ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                        (torch.bfloat16, torch.bfloat16))}


def _key(pair: tuple[torch.dtype, torch.dtype]) -> str:
    return "->".join(str(d).replace("torch.", "") for d in pair)


def decide(precision: str, device: torch.device | str, info=None) -> dict[str, str]:
    """The plan of a run in ``precision`` on ``device``: rank 0 of ``info`` (a DistInfo; None: one process)
    probes each pair (:func:`stfast.ops.gemm.gemm_library`), every rank applies rank 0's choices. Empty on CUDA
    (cuBLAS, nothing to choose) and for precision 64. Call after the run's thread count is set."""
    pairs = PAIRS.get(precision, ()) if torch.device(device).type == "cpu" else ()
    codes = np.array([gemm.LIBRARIES.index(gemm.gemm_library(*p)) for p in pairs], dtype=np.float64)
    if info is not None and info.distributed and len(pairs):
        codes = dp.broadcast_floats(codes, info)
    plan = {_key(p): gemm.LIBRARIES[int(c)] for p, c in zip(pairs, codes)}
    apply(plan)
    return plan


def apply(plan: dict[str, str] | None) -> None:
    """Fix the library of each pair of ``plan`` (a recorded run's; None or {}: nothing). ValueError for an
    unknown dtype or library name (a damaged checkpoint)."""
    for key, library in (plan or {}).items():
        try:
            operands, out = (getattr(torch, name) for name in key.split("->"))
        except (AttributeError, ValueError):
            raise ValueError(f"GEMM plan: bad dtype pair {key!r} (expected e.g. 'float32->float32')") from None
        gemm.select_gemm_library(operands, library, out)
