"""Which library runs a GEMM (csrc/common/gemm.h, the one place that decides it), and products through it.

On the CPU, stfast's fused kernels run every GEMM through a library chosen at run time per (operand dtype,
output dtype), use and thread count, by timing the candidates once at the fused LSTM's shapes (no CPU-vendor
check): ``"aten"`` — ``torch.mm`` (MKL or OpenBLAS for float32 / float64) —, ``"onednn"`` — torch's bundled
oneDNN matmul (float32; bfloat16 / float16 operands only with their own dtype as output: its 16-bit result is
the float32 sum rounded once) — or ``"brgemm"`` — oneDNN's batch-reduce micro-kernel through torch's
``cpublas::brgemm``, the weight laid out once (float32 on AVX2 / AVX-512; bfloat16 / float16 on stfast's own
VNNI-2 layout where the kernel takes them: AVX512-BF16, AMX; float32 outputs). One bf16 contract on every CPU:
a float32 output of 16-bit operands is their float32 sum, rounded once. Two uses are chosen separately
(:data:`USES`): ``"bulk"`` — products over a whole batch's rows (projections, gradients, model layers) — and
``"step"`` — a recurrent step's few rows times a weight prepared once per call. float64 has only ``"aten"``.
``STFAST_GEMM=aten|onednn|brgemm`` in the environment forces one for every use. On CUDA every product is
cuBLAS (through ATen, float32 compute for 16-bit operands).

- :func:`gemm_libraries_available` — the libraries that take a dtype pair on this CPU;
- :func:`gemm_library` — the library chosen for a dtype and use (probes on first use);
- :func:`bulk_library` — the same for bulk products, remembered in Python (for a model layer's every forward);
- :func:`gemm_rates` — the probe's measurement, GFLOP/s per library;
- :func:`select_gemm_library` — fix the choice (a library name, or rates as the probe would give them);
- :func:`reset_gemm_library` — forget every choice;
- :func:`mm` / :func:`linear` — products through the chosen library, with autograd (for model layers);
- :func:`micro_kernel` / :func:`use_micro_kernel` — the micro-kernel seam: torch's kernel, or a reference that
  enforces oneDNN's contract (panel widths 16/32/48/64, even depth, VNNI-2 layout, tile configure / release per
  thread) and multiplies exactly, so the 16-bit and AMX branches run on any CPU (``STFAST_UKERNEL=reference``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from .fake import refuse_mixed_meta

__all__ = ["LIBRARIES", "MICRO_KERNELS", "USES", "bulk_library", "micro_kernel", "use_micro_kernel", "gemm_libraries_available", "gemm_library", "gemm_rates", "linear",
           "mm", "reset_gemm_library", "select_gemm_library"]

LIBRARIES = ("aten", "onednn", "brgemm")  # csrc/common/gemm.h, enum Library, in order
USES = ("bulk", "step")  # csrc/common/gemm.h, enum Use, in order
MICRO_KERNELS = ("torch", "reference")  # csrc/common/ukernel.h, enum Impl, in order


def _out(dtype: torch.dtype, out_dtype: torch.dtype | None) -> torch.dtype:
    return dtype if out_dtype is None else out_dtype


def _use(use: str) -> int:
    if use not in USES:
        raise ValueError(f"stfast.gemm: use must be one of {USES}, got {use!r}")
    return USES.index(use)


def gemm_libraries_available(dtype: torch.dtype, out_dtype: torch.dtype | None = None) -> tuple[str, ...]:
    """The libraries (of :data:`LIBRARIES`, in order) that take ``dtype`` operands with an ``out_dtype`` output
    on this CPU and torch build, as the libraries themselves report it: ``"aten"`` always; ``"onednn"`` where
    torch's oneDNN matmul runs the dtype (it needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT or Graviton3), with the
    operands' own dtype as output; ``"brgemm"`` for float32 operands (oneDNN's micro-kernel from AVX2 up, torch's
    fallback below), and for bfloat16 / float16 operands where an exact self-check of the micro-kernel on the
    VNNI-2 layout passes (AVX512-BF16, AMX, or the reference seam: :func:`use_micro_kernel`); float32 outputs, or
    the operands' own. Nothing but ``"aten"`` while ``torch.backends.mkldnn`` is disabled for 16-bit operands.
    Capping oneDNN (``ONEDNN_MAX_CPU_ISA``) before the first product narrows them as on a smaller CPU."""
    return tuple(torch.ops.stfast.gemm_takes(dtype, _out(dtype, out_dtype)))


def gemm_library(dtype: torch.dtype, out_dtype: torch.dtype | None = None, use: str = "bulk") -> str:
    """Name of the CPU GEMM library (one of :data:`LIBRARIES`) that stfast uses for ``dtype`` operands with
    an ``out_dtype`` output (default ``dtype``) in ``use`` (one of :data:`USES`) at the current thread count;
    the first query per pair, use and thread count runs the probe (~0.1 s). ValueError for an unknown use."""
    return torch.ops.stfast.gemm_library(dtype, _out(dtype, out_dtype), _use(use))


# (operands, out, mkldnn enabled) -> (thread count, library): bulk_library's memory of the C++ choice, which is kept per pair for
# one thread count too (csrc/common/gemm_cpu.cpp, library_for); select_gemm_library / reset_gemm_library clear it
_BULK: dict[tuple[torch.dtype, torch.dtype], tuple[int, str]] = {}


def bulk_library(dtype: torch.dtype, out_dtype: torch.dtype | None = None) -> str:
    """:func:`gemm_library` of ``dtype`` operands with an ``out_dtype`` output for ``"bulk"`` use, remembered
    here per pair for the thread count it was chosen at, as the C++ side remembers it (another thread count asks
    it again, which may probe); :func:`select_gemm_library` and :func:`reset_gemm_library` forget it. For a
    model layer's every forward (``stfast.nn.Linear``): a dict lookup (~0.3 µs) instead of an op call (~5 µs)."""
    key = (dtype, _out(dtype, out_dtype), torch.backends.mkldnn.enabled)
    threads = torch.get_num_threads()
    known = _BULK.get(key)
    if known is not None and known[0] == threads:
        return known[1]
    library = gemm_library(*key[:2])
    _BULK[key] = (threads, library)
    return library


def gemm_rates(dtype: torch.dtype, out_dtype: torch.dtype | None = None, use: str = "bulk") -> dict[str, float]:
    """The probe, run now: GFLOP/s of each library (:data:`LIBRARIES`) for ``dtype`` operands with an
    ``out_dtype`` output on the fused LSTM's shapes at H 128 for ``use`` — ``"bulk"``: 1,024 rows × 128 ×
    512 and a weight gradient's 512 × 1,024 × 128; ``"step"``: 16, 32 and 64 rows × 128 × 512 with the weight
    prepared once —; 0.0 where a library does not take the pair. Does not change the choice."""
    return dict(zip(LIBRARIES, torch.ops.stfast.gemm_rates(dtype, _out(dtype, out_dtype), _use(use))))


def select_gemm_library(dtype: torch.dtype, choice: str | dict[str, float],
                        out_dtype: torch.dtype | None = None, use: str | None = None) -> str:
    """Fix the library for ``dtype`` operands with an ``out_dtype`` output in ``use`` (None: both uses)
    until :func:`reset_gemm_library` or another thread count: ``choice`` is a library name, or rates
    {library: GFLOP/s} (missing ones 0) judged by the probe's rule — the fastest, ``"aten"`` unless another
    is more than 10 % faster (25 % for ``"step"``: csrc/common/gemm.h says why). Returns the library now chosen (of the last use set; ``"aten"`` for a pair only
    it takes). ValueError for an unknown name or use, or a negative rate."""
    if isinstance(choice, str):
        if choice not in LIBRARIES:
            raise ValueError(f"stfast.gemm: library must be one of {LIBRARIES}, got {choice!r}")
        rates = [1.0 if lib == choice else 0.0 for lib in LIBRARIES]
    else:
        unknown = set(choice) - set(LIBRARIES)
        if unknown:
            raise ValueError(f"stfast.gemm: unknown libraries {sorted(unknown)} (known: {LIBRARIES})")
        rates = [float(choice.get(lib, 0.0)) for lib in LIBRARIES]
    chosen = ""
    for u in (USES if use is None else (use,)):
        chosen = torch.ops.stfast.gemm_select(dtype, _out(dtype, out_dtype), rates, _use(u))
    _BULK.clear()
    return chosen


def reset_gemm_library() -> None:
    """Forget every choice: the next GEMM of each dtype pair probes again."""
    torch.ops.stfast.gemm_reset()
    _BULK.clear()


def micro_kernel() -> str:
    """The micro-kernel implementation in effect (one of :data:`MICRO_KERNELS`): ``"torch"`` — oneDNN's kernel
    through ``cpublas::brgemm`` — or ``"reference"`` — stfast's contract-checking exact reference
    (csrc/common/ukernel.h), chosen by ``STFAST_UKERNEL`` at start or :func:`use_micro_kernel`."""
    return torch.ops.stfast.gemm_micro_kernel(None)


@contextlib.contextmanager
def use_micro_kernel(impl: str) -> Iterator[None]:
    """Run the micro-kernel's products through ``impl`` (one of :data:`MICRO_KERNELS`) inside the block, then
    restore the one before; both switches forget every library choice. The reference takes bfloat16 / float16
    on any CPU and checks every call against oneDNN's contract (RuntimeError naming the broken term): the
    16-bit and AMX code paths of the fused kernels and layers run, and are checked, on a CPU without them.
    Not for use while another thread runs products. ValueError for an unknown name."""
    if impl not in MICRO_KERNELS:
        raise ValueError(f"stfast.gemm: micro-kernel must be one of {MICRO_KERNELS}, got {impl!r}")
    before = torch.ops.stfast.gemm_micro_kernel(impl)
    _BULK.clear()
    try:
        yield
    finally:
        torch.ops.stfast.gemm_micro_kernel(before)
        _BULK.clear()


def mm(a: Tensor, b: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    """``a`` (R, K) · ``b`` (K, C) → (R, C) in ``out_dtype`` (default: the operands' dtype; else float32,
    e.g. for bfloat16 operands) through the chosen library; differentiable. ``a`` and ``b`` share a dtype
    and device. ValueError for wrong shapes, RuntimeError for mixed dtypes."""
    return torch.ops.stfast.gemm_mm(a, b, out_dtype)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``torch.nn.functional.linear`` through the chosen library: ``x`` (..., in) · ``weight`` (out, in)ᵀ
    (+ ``bias`` (out,)) → (..., out) in ``out_dtype`` (default ``x``'s dtype); differentiable. ``x`` and
    ``weight`` share a dtype (cast them first, e.g. to bfloat16 for bf16-mixed); the bias is added in the
    output dtype."""
    y = mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


@torch.library.register_fake("stfast::gemm_mm")
def _(a, b, out_dtype=None):
    refuse_mixed_meta("stfast.gemm_mm", a=a, b=b)
    torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
                 lambda: f"stfast.gemm_mm: a (R, K) and b (K, C) needed, got {tuple(a.shape)} and {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=_out(a.dtype, out_dtype))


def _setup_context(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _grad_mm(a: Tensor, b: Tensor) -> Tensor:
    """A gradient's product in the operands' dtype. 16-bit operands: float32 sums (the (16-bit, float32) pair's
    library, as the forward's), rounded once to the operands' dtype; not the (16-bit, 16-bit) pair, whose ATen
    path is torch's own 16-bit CPU mm (AMD EPYC Zen 3, AVX2: 2.8 GFLOP/s at 6,400 × 64 × 128, against 16 for
    ATen's widened float32 GEMM)."""
    if a.dtype in (torch.float16, torch.bfloat16) and not a.is_cuda:
        return torch.ops.stfast.gemm_mm(a, b, torch.float32).to(a.dtype)
    return torch.ops.stfast.gemm_mm(a, b, None)


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = _grad_mm(grad.to(b.dtype), b.t())
    if ctx.needs_input_grad[1]:
        gb = _grad_mm(a.t(), grad.to(a.dtype))
    return ga, gb, None


torch.library.register_autograd("stfast::gemm_mm", _backward, setup_context=_setup_context)
