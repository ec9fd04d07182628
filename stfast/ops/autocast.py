"""How stfast's fused ops take part in ``torch.autocast``, as built-in ops do: an Autocast kernel per op.

Without one, an op that torch's autocast lists do not name falls through and runs in whatever dtype its
inputs have: under ``torch.autocast("cpu", torch.bfloat16)`` the fused LSTM would get the float32 geo-conv
features and float32 master weights and run in float32, while the model's ``nn.Linear`` layers ran in
bfloat16. The kernels registered here give each op autocast's "lower precision" policy (the one of
``aten::mm``, ``aten::conv1d``, ``aten::mkldnn_rnn_layer``): floating tensors on the autocast device, except
float64 ones, are cast to the autocast dtype (``torch.get_autocast_dtype``: bfloat16 or float16, whatever the
caller chose) and the op runs with autocast off below it. Autograd records the casts, so parameter gradients
come back in the parameters' float32 (master weights), as for built-in ops. Inside a
:class:`stfast.ops.weight_casts.KeptCasts` block a weight's cast is made once and reused, as torch's own cast
cache does for built-in ops.

- ``stfast::lstm_forward``: lower precision on the CPU and CUDA (the kernels take float16/bfloat16 with
  float32 accumulation and cell state).
- ``stfast::geo_conv_forward``: lower precision on CUDA; on the CPU where its kernel takes the autocast
  dtype (checked once per dtype on a 1-trip input), else float32 (autocast's "fp32" policy: an op without a
  low-precision kernel runs in float32 — the geo-conv is ~1 % of a step's FLOPs).
- ``stfast::gemm_mm``: lower precision on the CPU and CUDA, as ``aten::mm`` / ``aten::linear`` (the model's
  ``stfast.nn.Linear`` layers on the chosen GEMM library; a float32 ``out_dtype`` keeps the float32 sums).

The backward ops need none: autograd calls them outside autocast with the dtypes of the saved forward
(``gemm_mm``'s backward is ``gemm_mm`` on the forward's operands: already in the autocast dtype).
:func:`register` adds only what is missing (idempotent). Run when :mod:`stfast.ops` is imported, so the ops and
the modules on them (``stfast.nn.LSTM``, ``GeoConv``) take part in autocast in any training loop.
"""
from __future__ import annotations

import functools

import torch

from .. import _C  # noqa: F401  (the ops must exist before kernels are added to them)
from . import weight_casts

_LIB = torch.library.Library("stfast", "IMPL")  # kept alive: the registrations live as long as the module


def _cast(value, device_type: str, dtype: torch.dtype):
    """``value`` with its floating tensors on ``device_type`` (float64 excepted) cast to ``dtype``; lists and
    tuples element by element (the LSTM's weights come as a list). Weights keep their casts inside a
    :class:`stfast.ops.weight_casts.KeptCasts` block (one per optimizer step), as torch's cast cache does."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type == device_type and value.dtype != torch.float64:
            return weight_casts.cast(value, dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, device_type, dtype) for v in value)
    return value


@functools.lru_cache(maxsize=None)
def _cpu_geo_conv_takes(dtype: torch.dtype) -> bool:
    """Whether the CPU geo-conv kernel accepts ``dtype`` (a 1-trip, 3-point call; RuntimeError: it does not)."""
    k, f_in, h, c = 3, 4, 2, 2
    z = lambda *s: torch.zeros(*s, dtype=dtype)  # noqa: E731
    try:  # without autograd: nothing is recorded
        with torch.no_grad():
            torch.ops.stfast.geo_conv_forward(z(k, f_in), torch.tensor([0, k]), z(1), z(h, f_in), z(h), z(c, h, k),
                                              z(c))
    except RuntimeError:
        return False
    return True


def _policy(op: str, device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype op ``op`` (its name in the stfast namespace) runs in under autocast to ``dtype``."""
    if op == "geo_conv_forward" and device_type == "cpu" and not _cpu_geo_conv_takes(dtype):
        return torch.float32
    return dtype


def _kernel(op: str, device_type: str, key: torch._C.DispatchKey):
    overload = getattr(torch.ops.stfast, op).default

    def kernel(_keyset, *args):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):  # the policy's probe too
            dtype = _policy(op, device_type, torch.get_autocast_dtype(device_type))
            return overload(*_cast(args, device_type, dtype))

    return kernel


def register(ops_: tuple[str, ...] = ("lstm_forward", "geo_conv_forward", "gemm_mm"),
             device_types: tuple[str, ...] = ("cpu", "cuda")) -> None:
    """Register the Autocast kernel of each op of ``ops_`` (names in the stfast namespace) on each device type,
    where none is registered yet. Idempotent."""
    for device_type in device_types:
        name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        key = getattr(torch._C.DispatchKey, name)
        for op in ops_:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"stfast::{op}", name):
                _LIB.impl(op, _kernel(op, device_type, key), name, with_keyset=True)


register()
