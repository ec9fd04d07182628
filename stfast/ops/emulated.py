"""stfast's CUDA kernels run on the CPU by its CUDA emulator (csrc/emu/): ``torch.ops.stfast_emu.*``.

The emulated ops take CPU tensors and run the same code a GPU runs, from the op's argument checks through
the launch arithmetic (grids, blocks, tiles, the reduction's groups for a given SM count) to every
``__global__`` kernel, one block after another, with per-block shared memory and ``__syncthreads``. They
exist for tests and sanitizer runs (tests/test_cuda_emulated.py, ``.ci/sanitize``), not for speed: a
block's threads run one at a time.

Ops (schemas as ``torch.ops.stfast``'s, csrc/emu/emu_ops.cpp): ``geo_conv_forward``,
``geo_conv_backward(..., sm_count=132)``, ``lstm_forward``, ``lstm_backward``, ``set_schedule(str)``,
``schedule() -> str``, and the emulator's self-tests ``selftest_shared_sum`` and ``selftest_barrier``.

Environment: ``STFAST_EMU_LIBRARY=PATH`` loads that build of the emulator library instead of the
package's ``stfast/_emu*.so`` (a sanitizer build); ``STFAST_EMU_LOG=FILE`` makes every emulated launch
append its kernel's name to FILE, one per line.
"""
from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import torch

__all__ = ["SCHEDULES", "library_path", "load", "schedule"]

# forward / reverse: a block's threads one after another between barriers, in thread order / reversed
# (deterministic: a read of a shared value another thread has not written yet reads poison); parallel:
# OS threads at a real barrier (what ThreadSanitizer needs).
SCHEDULES = ("forward", "reverse", "parallel")

_loaded: str | None = None


def library_path() -> str:
    """The emulator library to load: ``$STFAST_EMU_LIBRARY`` or the package's ``_emu`` extension.

    Raises FileNotFoundError when neither exists (stfast built without it: rebuild)."""
    env = os.environ.get("STFAST_EMU_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"STFAST_EMU_LIBRARY={env}: no such file")
        return env
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = sorted(glob.glob(os.path.join(here, "_emu*.so")))
    if not found:
        raise FileNotFoundError(f"stfast's CUDA emulator library (_emu*.so) is not in {here}: rebuild stfast "
                                "(pip install --no-build-isolation -e .)")
    return found[0]


def load():
    """Loads the emulator library once per process and returns ``torch.ops.stfast_emu``."""
    global _loaded
    if _loaded is None:
        path = library_path()
        torch.ops.load_library(path)
        _loaded = path
    return torch.ops.stfast_emu


@contextlib.contextmanager
def schedule(name: str) -> Iterator[None]:
    """Runs the enclosed emulated launches in schedule ``name`` (one of SCHEDULES), then restores the
    previous one. Raises ValueError for another name."""
    ops = load()
    previous = ops.schedule()
    ops.set_schedule(name)
    try:
        yield
    finally:
        ops.set_schedule(previous)
