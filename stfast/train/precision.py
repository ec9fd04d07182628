"""The numeric precision of a run: ``--precision 32 | 64 | bf16-mixed`` (PyTorch Lightning's names).

- ``32`` / ``64``: parameters, batches and every op in float32 / float64 (what ``--dtype float32`` /
  ``float64``, kept as an alias, always meant).
- ``bf16-mixed``: mixed precision as Lightning's ``precision="bf16-mixed"`` and Accelerate's
  ``mixed_precision="bf16"`` define it: float32 master weights, gradients, optimizer state, batches,
  loss and reductions; the forward pass runs under ``torch.autocast(device, torch.bfloat16)``, so GEMM
  operands (linear layers, the convolution, the LSTM: torch's and stfast's fused ops, see
  :mod:`stfast.ops.autocast`) are bfloat16 with float32 accumulation. No loss scaling (bfloat16
  has float32's exponent range). The backward pass runs outside autocast, in the dtypes the forward saved.
  Each weight is cast to bfloat16 once per optimizer step, not once per forward pass (k per step with
  gradient accumulation): the forward passes of a step (of an evaluation) share the casts
  (:func:`weight_casts`, :mod:`stfast.ops.weight_casts`), made again whenever a weight changes; the
  results are bitwise those of a cast per forward pass.

The precision is a run setting applied once around the forward (:func:`autocast`), never decided inside a
layer; the checkpoint records it (``train_config["precision"]``), and evaluation, prediction, ``eta`` and
``serve`` use it unless told otherwise (:func:`stfast.train.trained.load_model`).
"""
from __future__ import annotations

import contextlib
import functools

PRECISIONS = ("32", "64", "bf16-mixed")
#: --dtype (the alias) → --precision
FROM_DTYPE = {"float32": "32", "float64": "64"}
#: --precision → the dtype of parameters and batches (torch.float32 / torch.float64 by name)
PARAM_DTYPE = {"32": "float32", "64": "float64", "bf16-mixed": "float32"}
DEFAULT = "32"


def resolve(precision: str | None, dtype: str | None) -> tuple[str, str]:
    """(precision, parameter dtype name) from ``--precision`` and its alias ``--dtype`` (None: not given;
    neither given: 32). Raises ValueError naming both flags when they disagree (``--dtype float64
    --precision bf16-mixed``), or naming the flag of a value that is not one of its choices."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dtype is not None and dtype not in FROM_DTYPE:
        raise ValueError(f"--dtype must be float32 or float64, got {dtype!r}")
    if precision is None:
        precision = FROM_DTYPE[dtype] if dtype is not None else DEFAULT
    if dtype is not None and dtype != PARAM_DTYPE[precision]:
        raise ValueError(f"--dtype {dtype} (an alias of --precision {FROM_DTYPE[dtype]}) contradicts --precision "
                         f"{precision}, whose parameters are {PARAM_DTYPE[precision]}: give one of them")
    return precision, PARAM_DTYPE[precision]


def of_train_config(d: dict) -> str:
    """The precision a checkpoint's ``train_config`` records; checkpoints written before ``--precision``
    recorded only ``dtype`` (float32 → 32, float64 → 64; none: 32)."""
    return d.get("precision") or FROM_DTYPE.get(d.get("dtype") or "float32", DEFAULT)


def param_dtype(precision: str):
    """The torch dtype of parameters and batches under ``precision``."""
    import torch

    return getattr(torch, PARAM_DTYPE[precision])


def autocast(precision: str, device) -> contextlib.AbstractContextManager:
    """The context the forward pass (model and loss) runs in under ``precision`` on ``device`` (a
    torch.device or its name): ``torch.autocast(device type, torch.bfloat16)`` for bf16-mixed; a no-op for
    32 and 64 (their results stay bitwise what they were before mixed precision existed)."""
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    import torch

    from ..ops import weight_casts as kept

    if (block := kept.active()) is not None:  # inside weight_casts(): casts of weights changed since are dropped
        block.check()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def weight_casts(precision: str, device, weights) -> contextlib.AbstractContextManager:
    """The block whose forward passes in ``precision`` on ``device`` share their weights' casts: one optimizer
    step's micro-batches, or an evaluation's batches (``weights``: the model's parameters, an iterable of
    tensors). bf16-mixed: :class:`stfast.ops.weight_casts.KeptCasts`, each weight cast to bfloat16 once,
    again when it changes (checked by :func:`autocast` before each forward); 32 and 64: a no-op. Enter it
    outside :func:`autocast`."""
    if precision != "bf16-mixed":
        return contextlib.nullcontext()
    import torch

    from ..ops.weight_casts import KeptCasts

    return KeptCasts(torch.device(device).type, weights, torch.bfloat16)


def cpu_bf16_note(device) -> str | None:
    """A note for ``--precision bf16-mixed`` on ``device`` where it cannot be faster than float32, or None: on a CPU
    where no GEMM library takes bfloat16 operands but ATen, which widens them to float32
    (:func:`stfast.ops.gemm_libraries_available`, as the libraries report it; never by CPU name), the products run
    at float32's rate and the casts come on top (AMD EPYC Zen 3, AVX2, Chengdu B 64, 1 thread: 0.85× the trips/s of
    --precision 32)."""
    import torch

    if torch.device(device).type != "cpu":
        return None
    from ..ops.gemm import gemm_libraries_available

    if gemm_libraries_available(torch.bfloat16, torch.float32) != ("aten",):
        return None
    return ("note: no GEMM library on this CPU takes bfloat16 operands (oneDNN's matmul and micro-kernel refuse "
            "them), so bf16-mixed widens them to float32: it trains at float32's rate plus the casts, and "
            "--precision 32 is faster here")


@functools.cache
def stock_bf16_lstm_error() -> str | None:
    """Why stock PyTorch cannot run ``torch.nn.LSTM`` under CPU autocast bfloat16 here (``--kernels reference
    --precision bf16-mixed``), or None where it can: torch's oneDNN RNN refuses bfloat16 on CPUs without AVX-512
    (measured on an AMD EPYC Zen 3: "could not create a primitive descriptor for the LSTM forward propagation
    primitive"). Asked of torch once per process with a tiny LSTM, forward and backward; never by CPU name."""
    import torch

    lstm = torch.nn.LSTM(4, 8, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(torch.randn(2, 3, 4, requires_grad=True))
        out.float().sum().backward()
    except RuntimeError as e:
        return f"stock PyTorch cannot run torch.nn.LSTM under CPU autocast bfloat16 on this CPU ({str(e).splitlines()[0][:100]})"
    return None
