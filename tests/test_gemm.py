"""The CPU GEMM routing (csrc/common/gemm.h, stfast.ops.gemm): the selection rule on injected rates (never on
timings), per dtype pair and use, the probe's report, products through each library against torch.mm, and the
paths a CPU lacks run by capping oneDNN (ONEDNN_MAX_CPU_ISA) in a subprocess."""
import json
import os
import subprocess
import sys

import pytest
import torch

from _accuracy import fresh_seed
from conftest import require_gemm_library

from stfast.ops.gemm import (LIBRARIES, USES, bulk_library, gemm_libraries_available, gemm_library, gemm_rates,
                             linear, mm, reset_gemm_library, select_gemm_library, use_micro_kernel)

pytestmark = pytest.mark.usefixtures("fresh_gemm_choices")


@pytest.mark.parametrize("other", ["onednn", "brgemm"])
@pytest.mark.parametrize("use", USES)
@pytest.mark.parametrize("rates,want", [
    ({"aten": 100.0, "other": 200.0}, "other"),  # the probe says the other library is faster: it
    ({"aten": 200.0, "other": 100.0}, "aten"),
    ({"aten": 100.0, "other": 105.0}, "aten"),  # within the margin (10 %; steps 25 %): no flip on a near tie
    ({"aten": 100.0, "other": 111.0}, {"bulk": "other", "step": "aten"}),
    ({"aten": 100.0, "other": 126.0}, "other"),
    ({"aten": 100.0}, "aten"),  # a library that did not run (rate 0) is never chosen
    ({"aten": 0.0, "other": 50.0}, "other"),
])
def test_selection_follows_the_rates(rates, want, use, other):
    require_gemm_library(other)
    rates = {other if k == "other" else k: v for k, v in rates.items()}
    want = want[use] if isinstance(want, dict) else want
    want = other if want == "other" else want
    assert select_gemm_library(torch.float32, rates, use=use) == want
    assert gemm_library(torch.float32, use=use) == want  # the query reports the decision the kernels use


def test_selection_among_three():
    for lib in ("onednn", "brgemm"):
        require_gemm_library(lib)
    rates = {"aten": 100.0, "onednn": 150.0, "brgemm": 160.0}  # brgemm within 10 % of oneDNN: oneDNN stays
    assert select_gemm_library(torch.float32, rates) == "onednn"
    assert select_gemm_library(torch.float32, {**rates, "brgemm": 170.0}) == "brgemm"


def test_selection_per_dtype_pair_and_use():
    other = next(lib for lib in gemm_libraries_available(torch.float32) if lib != "aten")
    select_gemm_library(torch.float32, {"aten": 1.0, other: 3.0}, use="step")
    select_gemm_library(torch.float32, {"aten": 3.0, other: 1.0}, use="bulk")
    select_gemm_library(torch.bfloat16, {"aten": 3.0, other: 1.0}, torch.float32)
    assert gemm_library(torch.float32, use="step") == other
    assert gemm_library(torch.float32) == "aten"  # bulk: the default use
    assert gemm_library(torch.bfloat16, torch.float32, use="step") == "aten"  # use=None set both
    # float64: only ATen's BLAS takes it, whatever the rates say
    assert select_gemm_library(torch.float64, {"aten": 1.0, "onednn": 100.0, "brgemm": 100.0}) == "aten"
    assert gemm_library(torch.float64) == "aten"
    assert gemm_libraries_available(torch.float64) == ("aten",)
    assert "brgemm" in gemm_libraries_available(torch.float32)  # float32: the kernel, or torch's fallback under it


def test_selection_rejects_bad_input():
    with pytest.raises(ValueError, match="must be one of"):
        select_gemm_library(torch.float32, "mkl")
    with pytest.raises(ValueError, match="unknown libraries"):
        select_gemm_library(torch.float32, {"openblas": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        select_gemm_library(torch.float32, {"aten": -1.0})
    with pytest.raises(ValueError, match="use must be one of"):
        gemm_library(torch.float32, use="tall")


def test_bulk_library_remembers_the_choice_per_thread_count():
    """bulk_library (the model layers' per-forward query) answers what the C++ side chose: after a selection, after
    a reset, and at another thread count (the C++ choice is per thread count: there it asks again)."""
    select_gemm_library(torch.float32, "brgemm")
    assert bulk_library(torch.float32) == "brgemm" == gemm_library(torch.float32)
    select_gemm_library(torch.float32, "aten")
    assert bulk_library(torch.float32) == "aten"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        torch.ops.stfast.gemm_select(torch.float32, torch.float32, [0.0, 0.0, 1.0], 0)  # C++ only: brgemm
        assert bulk_library(torch.float32) == "brgemm"
    finally:
        torch.set_num_threads(threads)
    reset_gemm_library()
    select_gemm_library(torch.float32, "brgemm", use="bulk")
    assert bulk_library(torch.float32, torch.float32) == "brgemm"
    assert bulk_library(torch.float64) == "aten"  # float64: ATen's alone
    assert bulk_library(torch.bfloat16, torch.float32) == gemm_library(torch.bfloat16, torch.float32)


@pytest.mark.parametrize("use", USES)
def test_probe_reports_every_library(use):
    r = gemm_rates(torch.float32, use=use)
    assert set(r) == set(LIBRARIES) and r["aten"] > 0 and r["brgemm"] > 0
    for lib in LIBRARIES:  # a library that does not take the pair reports 0, one that does a rate
        assert (r[lib] > 0) == (lib in gemm_libraries_available(torch.float32)), (lib, r)
    r64 = gemm_rates(torch.float64, use=use)
    assert r64["onednn"] == 0.0 and r64["brgemm"] == 0.0  # float64 is ATen's alone
    assert gemm_library(torch.float32, use=use) in LIBRARIES  # the probe's own decision


@pytest.mark.parametrize("library,kernel", [(lib, "torch") for lib in LIBRARIES] + [("brgemm", "reference")])
def test_products_match_torch_mm(library, kernel):
    """Products through each library (the micro-kernel also through the reference seam, which takes 16-bit
    operands on any CPU) against float64 products of the same operands: float32 sums."""
    with use_micro_kernel(kernel):
        _products_match_torch_mm(library)


def _products_match_torch_mm(library):
    g = torch.Generator().manual_seed(fresh_seed())
    a, w = torch.randn(37, 61, generator=g), torch.randn(512, 61, generator=g)
    select_gemm_library(torch.float32, library)
    ref = a.double() @ w.double().t()
    for a_, w_t in ((a, w.t()), (a.t().contiguous().t(), w.t().contiguous())):  # transposed / row-major operands
        out = mm(a_, w_t)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # a deep product, as a weight gradient over a block of rows (the micro-kernel sums its depth in chunks)
    deep_a, deep_b = torch.randn(1300, 40, generator=g).t(), torch.randn(1300, 96, generator=g)
    torch.testing.assert_close(mm(deep_a, deep_b).double(), deep_a.double() @ deep_b.double(), rtol=1e-5, atol=1e-4)
    for depth in (61, 64):  # an odd depth (VNNI pairs rows: the 16-bit micro-kernel hands it to ATen)
        ab, wb = torch.randn(37, depth, generator=g).bfloat16(), torch.randn(512, depth, generator=g).bfloat16()
        select_gemm_library(torch.bfloat16, library, torch.float32)
        out16 = mm(ab, wb.t(), torch.float32)
        assert out16.dtype == torch.float32
        ref16 = ab.double() @ wb.double().t()  # exact products of the bfloat16 operands
        # one bf16 contract on every library (gemm.h): float32 sums, one rounding
        torch.testing.assert_close(out16.double(), ref16, rtol=2e-6, atol=2e-6 * float(ref16.abs().max()))
    # a 16-bit output: the float32 sum rounded once (every library)
    select_gemm_library(torch.bfloat16, library)
    out_b = mm(ab, wb.t())
    assert out_b.dtype == torch.bfloat16
    torch.testing.assert_close(out_b.double(), ref16, rtol=2.0 ** -7, atol=2.0 ** -7 * float(ref16.abs().max()))
    # float64 stays ATen's, bit for bit
    a64, w64 = a.double(), w.double()
    assert torch.equal(mm(a64, w64.t()), torch.mm(a64, w64.t()))


def test_gemm_mm_opcheck_and_gradients():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    torch.library.opcheck(torch.ops.stfast.gemm_mm.default, (a, b, None))
    torch.library.opcheck(torch.ops.stfast.gemm_mm.default, (a.float().bfloat16(), b.float().bfloat16(), torch.float32))
    assert torch.autograd.gradcheck(lambda x, y: mm(x, y), (a.requires_grad_(), b.requires_grad_()))
    x = torch.randn(2, 4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(linear(x, w, bias), torch.nn.functional.linear(x, w, bias))
    assert torch.autograd.gradcheck(linear, (x, w, bias))


def test_gemm_mm_errors():
    with pytest.raises(ValueError, match="a \\(R, K\\) and b \\(K, C\\)"):
        mm(torch.ones(2, 3), torch.ones(4, 5))
    with pytest.raises(RuntimeError, match="dtype or float32"):
        mm(torch.ones(2, 3), torch.ones(3, 5), torch.float16)


@pytest.mark.parametrize("forced", ["onednn", "brgemm"])
def test_environment_forces_a_library(forced):
    require_gemm_library(forced)
    code = ("import torch, stfast.ops as o; o.select_gemm_library(torch.float32, 'aten');"
            "print(o.gemm_library(torch.float32), o.gemm_library(torch.float32, use='step'), o.gemm_library(torch.float64))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "STFAST_GEMM": forced},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [forced, forced, "aten"]  # the environment wins, for both uses; float64 has only ATen


CAPPED = """
import json, torch
from stfast.ops.gemm import gemm_libraries_available, mm, select_gemm_library
g = torch.Generator().manual_seed({seed})
a, w = torch.randn(70, 128, generator=g), torch.randn(128, 96, generator=g)
err = {{}}
for dtype in (torch.float32, torch.bfloat16):
    for lib in gemm_libraries_available(dtype, torch.float32):
        select_gemm_library(dtype, lib, torch.float32)
        out = mm(a.to(dtype), w.to(dtype), torch.float32)
        ref = a.to(dtype).double() @ w.to(dtype).double()
        err[f"{{dtype}}:{{lib}}"] = float(((out.double() - ref).abs().max() / ref.abs().max()))
print(json.dumps({{"f32": gemm_libraries_available(torch.float32), "bf16": gemm_libraries_available(torch.bfloat16,
                  torch.float32), "err": err}}))
"""


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE_BF16"])
def test_capped_isa_runs_the_smaller_cpus_paths(isa):
    """oneDNN capped (ONEDNN_MAX_CPU_ISA) as on a CPU without AMX (AVX512_CORE_BF16) or without AVX-512 (AVX2):
    the micro-kernel still takes float32 (AVX2 / AVX-512); bfloat16 only from AVX512-BF16 up (its exact
    self-check decides: never under AVX2), and every library that takes a pair computes it to float32 accuracy
    with a float32 output (one bf16 contract: oneDNN's 16-bit-output matmul does not take (bfloat16, float32))."""
    seed = fresh_seed()
    out = subprocess.run([sys.executable, "-c", CAPPED.format(seed=seed)],
                         env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa},
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert "brgemm" in got["f32"] and "onednn" not in got["bf16"], got
    if isa == "AVX2":
        assert "brgemm" not in got["bf16"], got
    for key, err in got["err"].items():
        assert err < 1e-5, (seed, key, err)


@pytest.mark.parametrize("kernel", ["torch", "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_micro_kernel_tail_shapes(dtype, kernel):
    """The 16-bit micro-kernel path (AVX512-BF16 / AMX natively; the reference seam on any CPU) at the model's
    tail shapes: outputs N 1, 28, 156 (panels padded to 64 columns), an odd depth (padded to even), 1-70 rows, a
    deep product in chunks; float32 outputs of exact 16-bit products (float32 sums), and 16-bit outputs rounded
    once."""
    with use_micro_kernel(kernel):
        require_gemm_library("brgemm", dtype, torch.float32)
        g = torch.Generator().manual_seed(fresh_seed())
        select_gemm_library(dtype, "brgemm", torch.float32)
        select_gemm_library(dtype, "brgemm")
        for M, K, N in [(70, 128, 96), (7, 128, 1), (33, 64, 28), (5, 61, 156), (1, 2, 64), (40, 1100, 50)]:
            a, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype)
            ref = a.double() @ w.double().t()
            out = mm(a, w.t(), torch.float32)
            assert out.dtype == torch.float32
            torch.testing.assert_close(out.double(), ref, rtol=2e-6, atol=2e-6 * K ** 0.5 * float(ref.abs().max()))
            out16 = mm(a, w.t())
            assert out16.dtype == dtype
            torch.testing.assert_close(out16.double(), ref.to(dtype).double(), rtol=0, atol=torch.finfo(dtype).eps *
                                       float(ref.abs().max()))
