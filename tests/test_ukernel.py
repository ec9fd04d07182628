"""The micro-kernel seam (csrc/common/ukernel.h, issue 60): every call of oneDNN's micro-kernel goes through it, to
torch's kernel or to a reference that enforces oneDNN's contract (panel widths 16/32/48/64, even depth, the VNNI-2
layout, tile configure / release per thread) and multiplies exactly. With it the 16-bit (AVX512-BF16, AMX) code
paths of the layers and the fused LSTM run in CI on any CPU, and a mutant of the panel width, of the layout or of
the tile release is caught. Also: the bf16 contract (float32 sums, one rounding) and float64 sums."""
import json
import os
import subprocess
import sys

import pytest
import torch
from _accuracy import fresh_seed

from stfast.ops.gemm import (gemm_libraries_available, gemm_library, micro_kernel, mm, reset_gemm_library,
                             select_gemm_library, use_micro_kernel)

pytestmark = pytest.mark.usefixtures("fresh_gemm_choices")

# Products at the model's tail widths, then a 2-layer bfloat16 LSTM (H 50: a narrow last panel in the fused step,
# an odd-free depth) forward and backward, all on the 16-bit micro-kernel; prints what happened as JSON.
PROBE = """
import json, torch
from stfast.ops.gemm import select_gemm_library, mm
from stfast.nn import LSTM
torch.set_num_threads(1)
g = torch.Generator().manual_seed({seed})
res = {{"error": None, "max_rel_err": 0.0, "configured_after": None}}
try:
    for dtype in (torch.bfloat16,):
        select_gemm_library(dtype, "brgemm", torch.float32)
        for M, K, N in [(33, 64, 28), (5, 128, 156), (7, 128, 1)]:
            a, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)
            ref = a.double() @ w.double()
            err = float((mm(a, w, torch.float32).double() - ref).abs().max() / ref.abs().max())
            res["max_rel_err"] = max(res["max_rel_err"], err)
        lstm = LSTM(12, 50, 2, batch_first=True).to(dtype)
        x = torch.randn(4, 9, 12, generator=g).to(dtype).requires_grad_()
        out, _ = lstm(x, lengths=torch.tensor([9, 7, 9, 2]))
        out.float().sum().backward()
except RuntimeError as e:
    res["error"] = str(e).splitlines()[0]
res["configured_after"] = torch.ops.stfast.gemm_tiles_configured()
print(json.dumps(res))
"""


def _run_probe(mutant: str | None) -> dict:
    env = {**os.environ, "STFAST_UKERNEL": "reference"}
    env.pop("STFAST_UKERNEL_MUTANT", None)
    if mutant:
        env["STFAST_UKERNEL_MUTANT"] = mutant
    out = subprocess.run([sys.executable, "-c", PROBE.format(seed=fresh_seed())], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_seam_runs_the_16bit_paths_on_any_cpu():
    """STFAST_UKERNEL=reference: the micro-kernel takes bfloat16 on this CPU, products at N 28, 156 and 1 are
    float32 sums of exact products, the fused LSTM runs forward and backward on it, and no thread is left holding
    a tile configuration."""
    got = _run_probe(None)
    assert got["error"] is None, got
    assert got["max_rel_err"] < 1e-6, got
    assert got["configured_after"] == 0, got


@pytest.mark.parametrize("mutant,caught_by", [
    ("panel-ld", "must be 16, 32, 48 or 64 columns wide"),  # the narrow last panel passed with its own width
    ("row-major", "wrong"),  # 16-bit panels not laid out as VNNI-2: the products come out wrong
    ("no-release", "still hold a tile configuration"),  # a run of 16-bit products never released
])
def test_a_mutant_of_the_layout_is_caught(mutant, caught_by):
    got = _run_probe(mutant)
    if caught_by == "wrong":
        assert got["error"] is None and got["max_rel_err"] > 1e-2, got
    else:
        assert got["error"] is not None and caught_by in got["error"], got
    assert got["configured_after"] == (1 if mutant == "no-release" else 0), got  # an exception releases too


def test_reference_switch_and_its_choices():
    """use_micro_kernel switches the seam and back; the reference takes 16-bit operands (float32 outputs) on any
    CPU, and a choice made on one implementation is not reused on the other."""
    before = micro_kernel()
    with use_micro_kernel("reference"):
        assert micro_kernel() == "reference"
        for dtype in (torch.bfloat16, torch.float16):
            assert "brgemm" in gemm_libraries_available(dtype, torch.float32)
        select_gemm_library(torch.bfloat16, "brgemm", torch.float32)
        assert gemm_library(torch.bfloat16, torch.float32) == "brgemm"
    assert micro_kernel() == before
    if "brgemm" not in gemm_libraries_available(torch.bfloat16, torch.float32):
        assert gemm_library(torch.bfloat16, torch.float32) == "aten"  # chosen anew, among what runs here
    with pytest.raises(ValueError, match="must be one of"):
        with use_micro_kernel("amx"):
            pass


def test_mkldnn_disabled_is_honoured_by_a_cached_choice():
    """torch.backends.mkldnn disabled: oneDNN's kernel takes no 16-bit operands (torch's own rule), so a cached
    choice of the micro-kernel is not reused; enabled again, it is chosen again by the probe's rule."""
    with use_micro_kernel("reference"):
        select_gemm_library(torch.bfloat16, "brgemm", torch.float32)
        try:
            torch.backends.mkldnn.enabled = False
            assert "brgemm" not in gemm_libraries_available(torch.bfloat16, torch.float32)
            assert gemm_library(torch.bfloat16, torch.float32) == "aten"
            a = torch.randn(9, 64).bfloat16()
            torch.testing.assert_close(mm(a, a.t(), torch.float32).double(), a.double() @ a.double().t(),
                                       rtol=2e-6, atol=1e-5)
        finally:
            torch.backends.mkldnn.enabled = True
        assert "brgemm" in gemm_libraries_available(torch.bfloat16, torch.float32)
        reset_gemm_library()


def test_no_library_rounds_a_float32_output_of_16bit_operands_twice():
    """One bf16 contract on every CPU: oneDNN's matmul (16-bit outputs only) never takes (bfloat16, float32), so
    whatever library runs it, a float32 output is the float32 sum of exact products (no rounding to bfloat16)."""
    for dtype in (torch.bfloat16, torch.float16):
        assert "onednn" not in gemm_libraries_available(dtype, torch.float32)
    g = torch.Generator().manual_seed(fresh_seed())
    a, b = torch.randn(40, 96, generator=g).bfloat16(), torch.randn(96, 72, generator=g).bfloat16()
    ref = a.double() @ b.double()
    for kernel in ("torch", "reference"):
        with use_micro_kernel(kernel):
            for lib in gemm_libraries_available(torch.bfloat16, torch.float32):
                select_gemm_library(torch.bfloat16, lib, torch.float32)
                out = mm(a, b, torch.float32)
                # a bfloat16 rounding would be ~2^-9 relative; float32 sums stay ~1e-7
                assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-6, (kernel, lib)


def test_float64_operands_keep_float64_sums_for_a_float32_output():
    """gemm.h: float64 operands are summed in float64; a float32 output is that sum rounded once (before, the
    operands were narrowed to float32 first)."""
    g = torch.Generator().manual_seed(fresh_seed())
    a = torch.randn(31, 257, generator=g, dtype=torch.float64) * 1e3
    b = torch.randn(257, 19, generator=g, dtype=torch.float64)
    out = mm(a, b, torch.float32)
    assert out.dtype == torch.float32
    assert torch.equal(out, (a @ b).float())
