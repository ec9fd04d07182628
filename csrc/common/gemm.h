// The one place that decides how a CPU GEMM runs (ARCHITECTURE.md): which library computes
// out (=, or +=) a · b for a pair (operand dtype, output dtype). The fused ops' C++ (csrc/lstm/lstm_cpu.cpp)
// and the model's layers (stfast/ops/gemm.py: torch.ops.stfast.gemm_mm) both go through gemm::mm.
//
// Libraries (all inside the torch wheel; no GEMM of our own):
//   kAten   — at::mm / addmm_: MKL's (or OpenBLAS's) sgemm / dgemm for float32 / float64; for a float32
//             output with float16 / bfloat16 operands, the operands widened to float first (exact products,
//             float accumulation).
//   kOneDnn — torch's bundled oneDNN matmul primitive (at::native::mkldnn_matmul, the one torch itself uses
//             for bfloat16 mm): float32, and bfloat16 / float16 operands accumulated in float32 (AVX512-BF16 /
//             AMX where the CPU has them). Its output is the operands' dtype: a float32 output of 16-bit
//             operands is that result rounded once to 16 bits, then widened (torch exports no float32 one).
//   kBrgemm — oneDNN's batch-reduce micro-kernel through torch's cpublas::brgemm (csrc/common/brgemm.h): the
//             right operand packed once (prepare: once per layer and call for the fused LSTM's weights), then
//             one kernel call per tile with no primitive or fork overhead. float32 (AVX2 / AVX-512), and
//             bfloat16 / float16 where the CPU packs them (AMX); float32 output, so a 16-bit product's sum is
//             never rounded (a 16-bit output is the float32 tile rounded once).
// float64 has only kAten. Which one runs is decided at run time, once per (operand, output) dtype pair and
// thread count, by timing each at the fused LSTM's shapes (probe_rates): no vendor or CPU-name check. Why
// timing: on a 2-core AMD EPYC (AVX-512, AVX512-BF16) MKL runs its AVX2 path, ~100 GFLOP/s float32, while
// oneDNN reaches 170-240 float32 and 290-500 bfloat16; on Intel CPUs MKL may win; on AMX the micro-kernel
// runs bfloat16 tiles of 16-64 rows at 1,000-1,800 (issue 51). STFAST_GEMM=aten|onednn|brgemm forces a
// library (where it supports the dtype pair).
#pragma once

#include <ATen/core/Tensor.h>

#include "brgemm.h"

#include <array>
#include <string>
#include <vector>

namespace stfast {
namespace gemm {

enum Library : int { kAten = 0, kOneDnn = 1, kBrgemm = 2, kNumLibraries = 3 };

const char* library_name(Library lib);

// Two uses of a library, chosen separately per dtype pair because the libraries rank differently on them:
//   kBulk — products over all of a batch's rows (input projections, weight and input gradients, model layers);
//   kStep — a recurrent step: a few alive rows (16-64) times a weight prepared once per call (prepare()).
enum Use : int { kBulk = 0, kStep = 1 };

// out (R, C) (= or += with accumulate) a (R, K) · b (K, C) on CPU tensors, in the library chosen for
// (a's dtype, out's dtype); a and b share a dtype; out may be a row range of a larger tensor and a / b
// transposed views. Accumulation: float32 (float64 for float64 operands).
void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

// A product's right operand b (K, C) prepared once for many products in one library (the fused LSTM's
// weights over a layer's time steps): the library chosen now for (b's dtype, out, kStep) and, for the micro-kernel,
// b packed. Products through it use that library even if the choice changes meanwhile.
// groups > 1 (the LSTM's four gates: b's columns are `groups` blocks of U each): packed with the columns
// interleaved in blocks of `unit` units (groups · unit a multiple of brgemm::kBlockN): block j holds units
// [j·unit, (j+1)·unit) of group 0, then of group 1, ..., for a step that applies the gates to each tile while it
// is hot (csrc/lstm/lstm_cpu.cpp). Such a Weight serves only that step: mm() refuses it.
struct Weight {
  at::Tensor b;
  Library lib = kAten;
  brgemm::PackedB packed;  // lib == kBrgemm
  int64_t groups = 1;      // > 1: packed interleaved (only when packed)
  int64_t unit = 0;        // units per group and block when interleaved
};
Weight prepare(const at::Tensor& b, at::ScalarType out, int64_t groups = 1, int64_t unit = 0);

// out (=, or +=) a · w.b in w's library; as mm otherwise.
void mm(const at::Tensor& out, const at::Tensor& a, const Weight& w, bool accumulate);

// Whether `lib` takes (operands, out) on this CPU and torch build.
bool takes(Library lib, at::ScalarType operands, at::ScalarType out);

// The library chosen for (operands, out, use): probes on first use (or after the thread count changed).
Library library_for(at::ScalarType operands, at::ScalarType out, Use use = kBulk);

// One product of a rate measurement: out (M, N) = a (M, K) · b (K, N), b a transposed weight as the kernels
// hold it; a_transposed: a is the transpose of a row-major (K, M) tensor (a weight gradient's dGᵀ).
struct Shape {
  int64_t M, K, N;
  bool a_transposed;
};

// GFLOP/s of each library over `shapes` (one pass runs each once), for `use` (kStep: b prepared once, outside
// the timing); 0 for a library that does not take the pair.
std::array<double, kNumLibraries> rates_at(at::ScalarType operands, at::ScalarType out, Use use,
                                           const std::vector<Shape>& shapes);

// GFLOP/s of each library at the use's probe shapes, measured now (0: the library does not take this pair).
std::array<double, kNumLibraries> probe_rates(at::ScalarType operands, at::ScalarType out, Use use = kBulk);

// The selection rule, on rates as probe_rates returns them: the fastest library; kAten unless another is
// more than the use's margin faster (a near tie must not flip the choice, and with it float32 bits, run to run).
// kStep's margin is wider: its probe times the products alone, and the fused LSTM's step adds work around them
// that the probe does not see (measured on an AMD EPYC Zen 3, AVX2, float32: the micro-kernel 1.10-1.17x MKL
// in the step probe, 0.95-1.05x in the LSTM's forward + backward).
constexpr double kMargin = 1.10;
constexpr double kStepMargin = 1.25;
Library choose(const std::array<double, kNumLibraries>& rates, Use use = kBulk);

// Fix the choice for (operands, out) from given rates (as if the probe had measured them); returns it
// (kAten for a pair only kAten takes, whatever the rates).
Library select(at::ScalarType operands, at::ScalarType out, const std::array<double, kNumLibraries>& rates,
               Use use = kBulk);

// Forget every choice (the next GEMM probes again).
void reset();

}  // namespace gemm
}  // namespace stfast
