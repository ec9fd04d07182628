"""Whether a benchmark's device is there, for the scripts that benchmarks/gpu_check.sh runs, and which CPU
a figure was measured on. Standard library only at import (gpu_check_tasks.py reads NO_GPU without paying for
torch's import)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["NO_GPU", "cpu_summary", "missing_device"]

# Exit status of a script asked for a device this machine lacks: returned after every import, so a CPU
# machine rehearses the GPU run's commands up to their first CUDA call (tests/test_gpu_check.py).
NO_GPU = 4


def missing_device(device: str) -> str | None:
    """Why ``device`` cannot run here ("cuda…" without a CUDA device, or with a CPU-only build of stfast),
    or None when it can (always for "cpu")."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return f"no GPU: torch {torch.__version__} sees no CUDA device"
    import stfast

    if not stfast.build_info()["cuda"]:
        return "no GPU: stfast was built without CUDA"
    return None


def cpu_summary() -> str:
    """The CPU model and the flags that decide the GEMM paths (lscpu's model name; /proc/cpuinfo flags among
    AVX2, AVX-512 F / BF16 / FP16, AMX), for every figure printed beside it."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
    return f"CPU {model} ({' '.join(f for f in wanted if f in flags) or 'none of ' + '/'.join(wanted)})"
