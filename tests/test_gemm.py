"""The CPU GEMM routing (csrc/common/gemm.h, stfast.ops.gemm): the selection rule on injected rates (never on
timings), the probe's report, and products through each library against torch.mm."""
import os
import subprocess
import sys

import pytest
import torch

from stfast.ops.gemm import (LIBRARIES, gemm_library, gemm_rates, linear, mm, reset_gemm_library,
                             select_gemm_library)


@pytest.fixture(autouse=True)
def _fresh_choices():
    reset_gemm_library()
    yield
    reset_gemm_library()


@pytest.mark.parametrize("rates,want", [
    ({"aten": 100.0, "onednn": 200.0}, "onednn"),  # the probe says oneDNN is faster: oneDNN
    ({"aten": 200.0, "onednn": 100.0}, "aten"),
    ({"aten": 100.0, "onednn": 105.0}, "aten"),  # within the 10 % margin: no flip on a near tie
    ({"aten": 100.0, "onednn": 111.0}, "onednn"),
    ({"aten": 100.0}, "aten"),  # a library that did not run (rate 0) is never chosen
    ({"aten": 0.0, "onednn": 50.0}, "onednn"),
])
def test_selection_follows_the_rates(rates, want):
    assert select_gemm_library(torch.float32, rates) == want
    assert gemm_library(torch.float32) == want  # the query reports the decision the kernels use


def test_selection_per_dtype_pair():
    select_gemm_library(torch.float32, {"aten": 1.0, "onednn": 3.0})
    select_gemm_library(torch.bfloat16, {"aten": 3.0, "onednn": 1.0}, torch.float32)
    assert gemm_library(torch.float32) == "onednn"
    assert gemm_library(torch.bfloat16, torch.float32) == "aten"
    # float64: only ATen's BLAS takes it, whatever the rates say
    assert select_gemm_library(torch.float64, {"aten": 1.0, "onednn": 100.0}) == "aten"
    assert gemm_library(torch.float64) == "aten"


def test_selection_rejects_bad_input():
    with pytest.raises(ValueError, match="must be one of"):
        select_gemm_library(torch.float32, "mkl")
    with pytest.raises(ValueError, match="unknown libraries"):
        select_gemm_library(torch.float32, {"openblas": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        select_gemm_library(torch.float32, {"aten": -1.0})


def test_probe_reports_every_library():
    r = gemm_rates(torch.float32)
    assert set(r) == set(LIBRARIES) and r["aten"] > 0
    assert gemm_rates(torch.float64)["onednn"] == 0.0  # oneDNN has no float64 GEMM
    assert gemm_library(torch.float32) in LIBRARIES  # the probe's own decision


@pytest.mark.parametrize("library", LIBRARIES)
def test_products_match_torch_mm(library):
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(37, 61, generator=g), torch.randn(512, 61, generator=g)
    select_gemm_library(torch.float32, library)
    ref = a.double() @ w.double().t()
    out = mm(a, w.t())  # a transposed operand, as the kernels pass W_hhᵀ
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    ab, wb = a.bfloat16(), w.bfloat16()
    select_gemm_library(torch.bfloat16, library, torch.float32)
    out16 = mm(ab, wb.t(), torch.float32)
    assert out16.dtype == torch.float32
    ref16 = ab.double() @ wb.double().t()  # exact products of the bfloat16 operands
    # float32 sum; oneDNN's output is rounded once to bfloat16 (gemm.h): 2^-8 relative
    tol = 2e-6 if library == "aten" else 2.0 ** -8
    torch.testing.assert_close(out16.double(), ref16, rtol=tol, atol=tol * float(ref16.abs().max()))
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


def test_environment_forces_a_library():
    code = ("import torch, stfast.ops as o; o.select_gemm_library(torch.float32, 'aten');"
            "print(o.gemm_library(torch.float32), o.gemm_library(torch.float64))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "STFAST_GEMM": "onednn"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["onednn", "aten"]  # the environment wins; float64 has only ATen
