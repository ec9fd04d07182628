// oneDNN's batch-reduce GEMM micro-kernel (ukernel) as torch exposes it: at::native::cpublas::brgemm in
// ATen/native/CPUBlas.h, what torch's own CPU flash attention runs on. One call computes one register-blocked
// tile C[M × nb] (+)= A[M × K] · B[K × nb] with the right operand B laid out once for the kernel ("packed"),
// so a product that reuses its weight (the fused LSTM's W_hhᵀ at every time step) pays no per-call packing,
// primitive creation or thread fork — the overheads that keep torch.mm / a oneDNN matmul primitive far below
// the kernel's rate at the small row counts of a recurrent step (issue 51's table: 16–64 rows).
//
// What runs where (torch's CPUBlas.cpp): float32 on oneDNN's kernel when the effective ISA is AVX2 or more
// (AVX2 FMA, AVX-512), else torch's fallback gemm; bfloat16 / float16 with B in VNNI-2 layout, from AVX512-BF16 up
// (AVX512-BF16 without AMX: ~200 GFLOP/s on a Zen 4 core against ~110 for float32; AMX: 1,000-1,800). stfast lays
// the VNNI-2 panels out itself (torch's cpublas::pack needs AMX, and packs only 16/32/48/64-wide panels): every
// 16-bit panel is zero-padded to kBlockN columns and its depth to an even K, so one layout serves AVX512-BF16
// and AMX, and whether the CPU takes it is asked of the kernel by an exact self-check (ukernel.h), never of the
// CPU's name. Every kernel call goes through ukernel.h's seam (torch's kernel, or the contract-checking
// reference that runs the 16-bit branches on any CPU). ONEDNN_MAX_CPU_ISA caps it like the rest of oneDNN.
// The result is float32 always (accumulation and output): no rounding of a 16-bit product's sum.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace stfast {
namespace gemm {
namespace brgemm {

// Column block of a packed panel. Why 64: oneDNN's AMX packing refuses 128 and 512 wide panels (issue 51),
// and 64 float32 columns are 4 AVX-512 / 8 AVX2 registers per row, the kernel's own N blocking.
constexpr int64_t kBlockN = 64;

// Rows per tile of a product. Why 32: the fused LSTM's split time loops hand each thread 16–64 live rows per
// step, and torch's kernel cache is keyed by M: a few distinct tile heights.
constexpr int64_t kTileM = 32;

// Depth per kernel call (even: VNNI pairs rows); deeper products are summed chunk by chunk (batch-reduce).
constexpr int64_t kBlockK = 512;

// Whether the micro-kernel takes (operands, out): float32 -> float32; bfloat16 / float16 -> float32 where the
// kernel multiplies them on the VNNI-2 layout (ukernel::takes: AVX512-BF16, AMX, or the reference seam).
bool takes(at::ScalarType operands, at::ScalarType out);

// B (K, N) laid out for the kernel once: N cut into panels of kBlockN columns (the last may be narrower), each
// a contiguous (K, nb) block — row-major for float32, VNNI-packed for 16-bit operands.
class PackedB {
 public:
  PackedB() = default;
  // b: a (K, N) CPU tensor, any strides, float32 / bfloat16 / float16 with takes(dtype, float32). 16-bit panels:
  // VNNI-2, kBlockN columns (zero-padded), depth K rounded up to even (a zero row).
  explicit PackedB(const at::Tensor& b);
  bool defined() const { return data_.defined(); }
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  at::ScalarType dtype() const { return data_.scalar_type(); }
  bool vnni() const { return vnni_; }

  // C (M, n1 − n0) (= or += with add_C) A (M, K) · B[:, n0:n1] on the calling thread (no fork): C points at the
  // output of column n0. A row-major with row stride lda (its dtype is the panels'), C float32 with row stride
  // ldc; n0 a multiple of kBlockN, n1 == N or a multiple of kBlockN. Callers keep M small (a tile: ≤ ~64 rows).
  // 16-bit with an odd K: A must hold K + 1 readable, finite columns (the padded row multiplies column K by 0).
  // The calling thread must close its run of 16-bit products with ukernel::TileScope / release.
  void mm(float* C, int64_t ldc, const void* A, int64_t lda, int64_t M, bool add_C, int64_t n0, int64_t n1) const;

 private:
  at::Tensor data_;  // panels one after another: panel j at j · K · kBlockN elements
  int64_t K_ = 0, N_ = 0;
  int64_t Kp_ = 0;  // the depth as laid out: K, or K + 1 for 16-bit panels of odd K
  bool vnni_ = false;
};

// out (R, C) (= or += with accumulate) a (R, K) · b (K, C) through the kernel, b packed for this call: a and b
// share a dtype that takes() accepts with a float32 out; out float32, or the operands' dtype (the float32 tile
// rounded once). Rows are cut into tiles over the intra-op threads (run inline inside a parallel region).
void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

// out (=, or +=) a · packed B: as mm, with B packed earlier (the fused LSTM's weights, once per call).
void mm_packed(const at::Tensor& out, const at::Tensor& a, const PackedB& b, bool accumulate);


}  // namespace brgemm
}  // namespace gemm
}  // namespace stfast
