"""Which CPU GEMM library a run uses, decided once and kept with the run (issue 44).

stfast's fused kernels choose their GEMM library (:mod:`stfast.ops.gemm`: ``aten`` — MKL / OpenBLAS —,
``onednn`` or ``brgemm``, oneDNN's micro-kernel) per use (bulk products, recurrent steps) by timing them at
first use. Float32 products of the two differ in their last bits, so a choice
that flipped between a run and its ``--resume`` (a load burst during the probe), between ranks, or between
training and ``evaluate`` would break what is exact today: resume bitwise after kill -9, every rank the same
numbers, evaluate equal to the run's test metrics. So the run decides once — rank 0 probes, every rank takes
its answer — records the plan in its checkpoints, and a resumed run, ``evaluate``, ``predict``, ``eta`` and
``serve`` apply the recorded plan instead of probing again.

A plan is ``{"float32->float32": "onednn", "float32->float32@step": "brgemm", ...}``: operand dtype -> output
dtype, then ``@step`` for the recurrent steps' choice (no suffix: the bulk products'), one entry per pair and
use the run's precision uses; float64 (precision 64) has only ``aten`` and no entry. A plan recorded before
the uses were told apart (no ``@step`` entries) applies its one library to both.
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


def _key(pair: tuple[torch.dtype, torch.dtype], use: str) -> str:
    base = "->".join(str(d).replace("torch.", "") for d in pair)
    return base if use == "bulk" else f"{base}@{use}"


def decide(precision: str, device: torch.device | str, info=None) -> dict[str, str]:
    """The plan of a run in ``precision`` on ``device``: rank 0 of ``info`` (a DistInfo; None: one process)
    probes each pair (:func:`stfast.ops.gemm.gemm_library`), every rank applies rank 0's choices. Empty on CUDA
    (cuBLAS, nothing to choose) and for precision 64. Call after the run's thread count is set."""
    pairs = PAIRS.get(precision, ()) if torch.device(device).type == "cpu" else ()
    entries = [(p, use) for p in pairs for use in gemm.USES]
    codes = np.array([gemm.LIBRARIES.index(gemm.gemm_library(*p, use=use)) for p, use in entries], dtype=np.float64)
    if info is not None and info.distributed and len(entries):
        codes = dp.broadcast_floats(codes, info)
    plan = {_key(p, use): gemm.LIBRARIES[int(c)] for (p, use), c in zip(entries, codes)}
    apply(plan)
    return plan


def apply(plan: dict[str, str] | None) -> None:
    """Fix the library of each pair of ``plan`` (a recorded run's; None or {}: nothing). ValueError for an
    unknown dtype or library name (a damaged checkpoint)."""
    # entries without a use first: an old plan's one library for both uses, then any @step choice over it
    for key, library in sorted((plan or {}).items(), key=lambda kv: "@" in kv[0]):
        pair, _, use = key.partition("@")
        try:
            operands, out = (getattr(torch, name) for name in pair.split("->"))
        except (AttributeError, ValueError):
            raise ValueError(f"GEMM plan: bad dtype pair {key!r} (expected e.g. 'float32->float32')") from None
        if use and use not in gemm.USES:
            raise ValueError(f"GEMM plan: bad use in {key!r} (expected one of {gemm.USES})")
        gemm.select_gemm_library(operands, library, out, use=use or None)


def for_run(resume: dict | None, precision: str, device, info=None) -> dict[str, str]:
    """A run's plan: the one its checkpoint ``resume`` recorded (applied), else :func:`decide`'s."""
    if resume is not None and "gemm_plan" in resume:
        apply(resume["gemm_plan"])
        return resume["gemm_plan"]
    return decide(precision, device, info)
