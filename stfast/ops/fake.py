"""A guard for the fake (meta) kernels of stfast's ops.

The dispatcher runs an op's fake kernel when any argument is a meta tensor. Under torch.compile /
FakeTensorMode every argument is fake, and the kernel's empty outputs describe shapes only. But a call
mixing one meta tensor with real CPU or CUDA tensors also lands there, and its "results" would be
uninitialized real tensors, returned without any check. :func:`refuse_mixed_meta` turns that into an
error naming the arguments.
"""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake


def refuse_mixed_meta(op: str, host: tuple[str, ...] = (), **tensors) -> None:
    """Raise ValueError when the named tensors (None and lists of tensors allowed) mix meta tensors with
    real (neither meta nor fake) ones: the fake kernel would return uninitialized real tensors. ``host``:
    names of host-side index arguments (offsets, lengths), which may stay real CPU tensors beside meta data
    (shape inference on meta points with host lengths is a supported call)."""
    flat = []
    for name, t in tensors.items():
        items = t if isinstance(t, (list, tuple)) else [t]
        flat += [(f"{name}[{i}]" if isinstance(t, (list, tuple)) else name, name, x) for i, x in enumerate(items)
                 if isinstance(x, torch.Tensor)]
    meta = [n for n, _, x in flat if x.device.type == "meta"]
    real = [(n, x.device) for n, base, x in flat if x.device.type != "meta" and not is_fake(x) and base not in host]
    if meta and real:
        raise ValueError(f"{op}: {', '.join(meta)} on the meta device but {', '.join(n for n, _ in real)} on "
                         f"{real[0][1]}: put every argument on one device")
