"""Whether a benchmark's device is there, for the scripts that benchmarks/gpu_check.sh runs. Standard library
only at import (gpu_check_tasks.py reads NO_GPU without paying for torch's import)."""
from __future__ import annotations

__all__ = ["NO_GPU", "missing_device"]

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
