"""The CPU kernels' workspace cache (csrc/common/cpu_workspace.h).

The fused LSTM's saved activations and gradient workspaces (``L · N · 4H`` values and more, ~90 MB per layer
pair at B 256 on Chengdu-length trips) come from an allocator of stfast's own: blocks of 2 MiB or more are
advised to use transparent huge pages, and freed blocks are kept for the next call instead of returned to the
system, because first touches of fresh memory (page faults, zeroing) cost ~15 % of a forward + backward on
the VMs we measured on. At most ``STFAST_CPU_WORKSPACE_CACHE_MB`` MiB are kept (environment variable, read
once at the first large allocation; default 1024; 0 disables the cache). CUDA tensors use PyTorch's caching
allocator as usual.
"""
from __future__ import annotations

import torch

__all__ = ["cpu_workspace_cached_bytes", "empty_cpu_workspace_cache"]


def cpu_workspace_cached_bytes() -> int:
    """Bytes of freed CPU workspace blocks held for reuse (int, bytes)."""
    return int(torch.ops.stfast.cpu_workspace_cached_bytes())


def empty_cpu_workspace_cache() -> None:
    """Return every cached CPU workspace block to the system (as ``torch.cuda.empty_cache`` does on CUDA).
    Tensors still alive keep their memory; it is freed or cached when they die."""
    torch.ops.stfast.cpu_workspace_empty_cache()
