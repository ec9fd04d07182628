// The micro-kernel path of csrc/common/brgemm.h: laying B out in panels and tiling products over it. Every kernel
// call goes through the seam of csrc/common/ukernel.h.
#include "brgemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "ukernel.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace stfast {
namespace gemm {
namespace brgemm {
namespace {

bool is_16bit(at::ScalarType st) { return st == at::kBFloat16 || st == at::kHalf; }

// Deliberate faults for the tests that prove the reference seam catches them (tests/test_ukernel.py):
// STFAST_UKERNEL_MUTANT=panel-ld (a narrow last panel passed with its own width, as torch's cpublas::pack laid it
// out), row-major (16-bit panels not in VNNI-2 layout), no-release (a run of 16-bit products left configured).
// Read once; unset in every real run.
enum class Mutant { kNone, kPanelLd, kRowMajor, kNoRelease };
Mutant mutant() {
  static const Mutant m = [] {
    const char* env = std::getenv("STFAST_UKERNEL_MUTANT");
    const std::string s = env == nullptr ? "" : env;
    if (s == "panel-ld") return Mutant::kPanelLd;
    if (s == "row-major") return Mutant::kRowMajor;
    if (s == "no-release") return Mutant::kNoRelease;
    return Mutant::kNone;
  }();
  return m;
}

// A run of products on this thread, closed on every exit path (no-release mutant: left open).
struct Tiles {
  explicit Tiles(bool vnni) : scope(vnni && mutant() != Mutant::kNoRelease) {}
  ukernel::TileScope scope;
};

}  // namespace

bool takes(at::ScalarType operands, at::ScalarType out) {
  if (out != at::kFloat) return false;
  return (operands == at::kFloat || is_16bit(operands)) && ukernel::takes(operands);
}

PackedB::PackedB(const at::Tensor& b) {
  TORCH_CHECK(b.dim() == 2 && b.device().is_cpu(), "stfast.gemm.brgemm: B must be a 2-D CPU tensor, got ",
              b.sizes(), " on ", b.device());
  const auto st = b.scalar_type();
  TORCH_CHECK(takes(st, at::kFloat), "stfast.gemm.brgemm: the micro-kernel does not take ", st, " on this CPU");
  K_ = b.size(0);
  N_ = b.size(1);
  TORCH_CHECK(K_ > 0, "stfast.gemm.brgemm: B must have a depth K > 0 (an empty sum is the caller's case)");
  vnni_ = is_16bit(st);
  Kp_ = vnni_ ? (K_ + 1) / 2 * 2 : K_;
  const int64_t panels = (N_ + kBlockN - 1) / kBlockN;
  // 16-bit panels zeroed first: the padding columns and the padding row multiply as zeros
  data_ = vnni_ ? at::zeros({std::max<int64_t>(panels, 1) * Kp_ * kBlockN}, b.options())
                : at::empty({std::max<int64_t>(panels, 1) * K_ * kBlockN}, b.options());
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t n0 = j * kBlockN, nb = std::min(kBlockN, N_ - n0);
    if (!vnni_) {
      data_.narrow(0, j * K_ * kBlockN, K_ * nb).view({K_, nb}).copy_(b.narrow(1, n0, nb));
      continue;
    }
    at::Tensor panel = data_.narrow(0, j * Kp_ * kBlockN, Kp_ * kBlockN);
    if (mutant() == Mutant::kRowMajor) {
      panel.view({Kp_, kBlockN}).narrow(0, 0, K_).narrow(1, 0, nb).copy_(b.narrow(1, n0, nb));
      continue;
    }
    // VNNI-2: element (k, n) at (k / 2) · 2 · kBlockN + 2 · n + k % 2, i.e. a (Kp/2, kBlockN, 2) view
    at::Tensor src = at::zeros({Kp_, kBlockN}, b.options());
    src.narrow(0, 0, K_).narrow(1, 0, nb).copy_(b.narrow(1, n0, nb));
    panel.view({Kp_ / 2, kBlockN, 2}).copy_(src.view({Kp_ / 2, 2, kBlockN}).transpose(1, 2));
  }
}

void PackedB::mm(float* C, int64_t ldc, const void* A, int64_t lda, int64_t M, bool add_C, int64_t n0,
                 int64_t n1) const {
  if (M <= 0) return;
  const auto st = dtype();
  const int64_t esize = static_cast<int64_t>(data_.element_size());
  const int64_t panel_elems = Kp_ * kBlockN;
  for (int64_t j0 = n0; j0 < n1; j0 += kBlockN) {
    const int64_t nb = std::min(kBlockN, N_ - j0);
    const int64_t off = (j0 / kBlockN) * panel_elems;
    // the depth in chunks of kBlockK, each added onto the last (the batch-reduce sum): a deep product (a weight
    // gradient over 1,024 rows) keeps its A and B chunks in cache. A chunk of rows [k0, k1) of a panel starts at
    // k0 · ld elements, in VNNI layout too (k0 even: pairs of rows).
    for (int64_t k0 = 0; k0 < Kp_; k0 += kBlockK) {
      const int64_t kb = std::min(kBlockK, Kp_ - k0);
      const bool add = add_C || k0 > 0;
      const void* a = static_cast<const char*>(A) + k0 * esize;
      float* c = C + (j0 - n0);
      if (st == at::kFloat) {
        ukernel::brgemm(M, nb, kb, lda, nb, ldc, add, static_cast<const float*>(a),
                        data_.const_data_ptr<float>() + off + k0 * nb, c);
        continue;
      }
      const int64_t ldb = mutant() == Mutant::kPanelLd ? nb : kBlockN;  // the padded panel's width
      if (st == at::kBFloat16) {
        ukernel::brgemm(M, nb, kb, lda, ldb, ldc, add, static_cast<const at::BFloat16*>(a),
                        data_.const_data_ptr<at::BFloat16>() + off + k0 * kBlockN, c);
      } else {
        ukernel::brgemm(M, nb, kb, lda, ldb, ldc, add, static_cast<const at::Half*>(a),
                        data_.const_data_ptr<at::Half>() + off + k0 * kBlockN, c);
      }
    }
  }
}

void mm_packed(const at::Tensor& out, const at::Tensor& a, const PackedB& b, bool accumulate) {
  TORCH_CHECK(b.defined() && a.dim() == 2 && out.dim() == 2 && a.size(1) == b.K() && out.size(0) == a.size(0) &&
                  out.size(1) == b.N() && a.scalar_type() == b.dtype(),
              "stfast.gemm.brgemm: out ", out.sizes(), " = a ", a.sizes(), " (", a.scalar_type(), ") · B (", b.K(),
              ", ", b.N(), ") (", b.dtype(), ") does not fit");
  const int64_t R = a.size(0), N = b.N(), K = b.K();
  if (R == 0 || N == 0) return;
  // not an ATen call: named for the profiler, so a profile counts these products as GEMMs
  RECORD_FUNCTION("stfast::brgemm", std::vector<c10::IValue>());
  // The kernel reads A row-major and writes C row-major; other layouts go through a copy. 16-bit operands of odd
  // depth: A widened by a zero column to the panels' even depth.
  at::Tensor A;
  if (b.vnni() && K % 2 != 0) {
    A = at::zeros({R, K + 1}, a.options());
    A.narrow(1, 0, K).copy_(a);
  } else {
    A = a.stride(1) == 1 && a.stride(0) >= K ? a : a.contiguous();
  }
  const bool direct = out.scalar_type() == at::kFloat && out.stride(1) == 1 && out.stride(0) >= N;
  at::Tensor C = direct ? out : at::empty({R, N}, out.options().dtype(at::kFloat));
  const bool add_C = accumulate && direct;
  const int64_t lda = A.stride(0), ldc = C.stride(0), esize = static_cast<int64_t>(A.element_size());
  const char* a0 = static_cast<const char*>(A.const_data_ptr());
  float* c0 = C.data_ptr<float>();
  const int64_t row_tiles = (R + kTileM - 1) / kTileM, col_tiles = (N + kBlockN - 1) / kBlockN;
  // tiles of kTileM rows × one panel; a task's grain ~ 1 M multiply-adds (the fork's cost)
  const int64_t grain = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(1, kTileM * kBlockN * K));
  at::parallel_for(0, row_tiles * col_tiles, grain, [&](int64_t t0, int64_t t1) {
    const Tiles tiles(b.vnni());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = (t / col_tiles) * kTileM, j0 = (t % col_tiles) * kBlockN;
      const int64_t m = std::min(kTileM, R - r0), n1 = std::min(N, j0 + kBlockN);
      b.mm(c0 + r0 * ldc + j0, ldc, a0 + r0 * lda * esize, lda, m, add_C, j0, n1);
    }
  });
  if (b.vnni() && !at::in_parallel_region()) ukernel::check_released("stfast.gemm.brgemm.mm");
  if (!direct) {
    if (accumulate) const_cast<at::Tensor&>(out).add_(C);
    else const_cast<at::Tensor&>(out).copy_(C);
  }
}

void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  mm_packed(out, a, PackedB(b), accumulate);
}

}  // namespace brgemm
}  // namespace gemm
}  // namespace stfast
