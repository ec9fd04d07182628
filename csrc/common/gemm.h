// The one place that decides how a CPU GEMM runs (ARCHITECTURE.md): which library computes
// out (=, or +=) a · b for a pair (operand dtype, output dtype). The fused ops' C++ (csrc/lstm/lstm_cpu.cpp)
// and the model's layers (stfast/ops/gemm.py: torch.ops.stfast.gemm_mm) both go through gemm::mm.
//
// Libraries (both well-kept, both inside the torch wheel; no GEMM of our own):
//   kAten   — at::mm / addmm_: MKL's (or OpenBLAS's) sgemm / dgemm for float32 / float64; for a float32
//             output with float16 / bfloat16 operands, the operands widened to float first (exact products,
//             float accumulation).
//   kOneDnn — torch's bundled oneDNN matmul primitive (at::native::mkldnn_matmul, the one torch itself uses
//             for bfloat16 mm): float32, and bfloat16 / float16 operands accumulated in float32 (AVX512-BF16 /
//             AMX where the CPU has them). Its output is the operands' dtype: a float32 output of 16-bit
//             operands is that result rounded once to 16 bits, then widened (torch exports no float32 one).
// float64 has only kAten. Which one runs is decided at run time, once per (operand, output) dtype pair and
// thread count, by timing both at the fused LSTM's shapes (probe_rates): no vendor or CPU-name check. Why
// timing: on a 2-core AMD EPYC (AVX-512, AVX512-BF16) MKL runs its AVX2 path, ~100 GFLOP/s float32, while
// oneDNN reaches 170-240 float32 and 290-500 bfloat16; on Intel CPUs MKL may win. STFAST_GEMM=aten|onednn
// forces a library (where it supports the dtype pair).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>

namespace stfast {
namespace gemm {

enum Library : int { kAten = 0, kOneDnn = 1, kNumLibraries = 2 };

const char* library_name(Library lib);

// out (R, C) (= or += with accumulate) a (R, K) · b (K, C) on CPU tensors, in the library chosen for
// (a's dtype, out's dtype); a and b share a dtype; out may be a row range of a larger tensor and a / b
// transposed views. Accumulation: float32 (float64 for float64 operands).
void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

// The library chosen for (operands, out): probes on first use (or after the thread count changed).
Library library_for(at::ScalarType operands, at::ScalarType out);

// GFLOP/s of each library at the probe shapes, measured now (0: the library does not take this pair).
std::array<double, kNumLibraries> probe_rates(at::ScalarType operands, at::ScalarType out);

// The selection rule, on rates as probe_rates returns them: the fastest library; kAten unless another is
// more than kMargin faster (a near tie must not flip the choice, and with it float32 bits, run to run).
constexpr double kMargin = 1.10;
Library choose(const std::array<double, kNumLibraries>& rates);

// Fix the choice for (operands, out) from given rates (as if the probe had measured them); returns it
// (kAten for a pair only kAten takes, whatever the rates).
Library select(at::ScalarType operands, at::ScalarType out, const std::array<double, kNumLibraries>& rates);

// Forget every choice (the next GEMM probes again).
void reset();

}  // namespace gemm
}  // namespace stfast
