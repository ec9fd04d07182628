// The micro-kernel path of csrc/common/brgemm.h: packing B into panels and tiling products over it.
#include "brgemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace stfast {
namespace gemm {
namespace brgemm {
namespace {

namespace cpublas = at::native::cpublas;

// The torch built against has the float32 and 16-bit micro-kernel entry points (ATen/native/CPUBlas.h names
// them by these macros); an older torch builds this path out: takes() is false, nothing here is called.
#if defined(CPUBLAS_BRGEMM_F32F32F32) && defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
#define STFAST_HAS_BRGEMM 1
constexpr bool kHasBrgemm = true;
#else
#define STFAST_HAS_BRGEMM 0
constexpr bool kHasBrgemm = false;
#endif

bool is_16bit(at::ScalarType st) { return st == at::kBFloat16 || st == at::kHalf; }

template <typename T>
void call(int64_t M, int64_t nb, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const T* A, const T* B,
          float* C, bool vnni) {
#if STFAST_HAS_BRGEMM
  cpublas::brgemm(M, nb, K, lda, ldb, ldc, add_C, A, B, C, vnni);
#else
  TORCH_CHECK(false, "stfast.gemm.brgemm: this torch has no cpublas::brgemm");
#endif
}

}  // namespace

bool takes(at::ScalarType operands, at::ScalarType out) {
  if (!kHasBrgemm || out != at::kFloat) return false;
  if (operands == at::kFloat) return true;
#if STFAST_HAS_BRGEMM
  return is_16bit(operands) && cpublas::could_pack(operands);
#else
  return false;
#endif
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
  // VNNI pairs rows: an odd K would need a padded A as well; 16-bit callers route odd K elsewhere (gemm_cpu.cpp)
  TORCH_CHECK(!vnni_ || K_ % 2 == 0, "stfast.gemm.brgemm: 16-bit operands need an even K, got ", K_);
  const int64_t panels = (N_ + kBlockN - 1) / kBlockN;
  data_ = at::empty({std::max<int64_t>(panels, 1) * K_ * kBlockN}, b.options().dtype(st));
  for (int64_t j = 0; j < panels; ++j) {
    const int64_t n0 = j * kBlockN, nb = std::min(kBlockN, N_ - n0);
    at::Tensor panel = data_.narrow(0, j * K_ * kBlockN, K_ * nb).view({K_, nb});
    if (!vnni_) {
      panel.copy_(b.narrow(1, n0, nb));
    } else {
#if STFAST_HAS_BRGEMM
      const at::Tensor src = b.narrow(1, n0, nb).contiguous();
      cpublas::pack(K_, nb, nb, nb, st, st, src.const_data_ptr(), panel.data_ptr());
#endif
    }
  }
}

void PackedB::mm(float* C, int64_t ldc, const void* A, int64_t lda, int64_t M, bool add_C, int64_t n0,
                 int64_t n1) const {
  if (M <= 0) return;
  const auto st = dtype();
  const int64_t esize = static_cast<int64_t>(data_.element_size());
  for (int64_t j0 = n0; j0 < n1; j0 += kBlockN) {
    const int64_t nb = std::min(kBlockN, N_ - j0);
    const int64_t off = (j0 / kBlockN) * K_ * kBlockN;
    // the depth in chunks of kBlockK, each added onto the last (the batch-reduce sum): a deep product (a weight
    // gradient over 1,024 rows) keeps its A and B chunks in cache. A chunk of rows [k0, k1) of a panel starts at
    // k0 · nb elements, in VNNI layout too (k0 even: pairs of rows).
    for (int64_t k0 = 0; k0 < K_; k0 += kBlockK) {
      const int64_t kb = std::min(kBlockK, K_ - k0);
      const bool add = add_C || k0 > 0;
      const void* a = static_cast<const char*>(A) + k0 * esize;
      float* c = C + (j0 - n0);
      if (st == at::kFloat) {
        call(M, nb, kb, lda, nb, ldc, add, static_cast<const float*>(a), data_.const_data_ptr<float>() + off + k0 * nb,
             c, false);
      } else if (st == at::kBFloat16) {
        call(M, nb, kb, lda, nb, ldc, add, static_cast<const at::BFloat16*>(a),
             data_.const_data_ptr<at::BFloat16>() + off + k0 * nb, c, true);
      } else {
        call(M, nb, kb, lda, nb, ldc, add, static_cast<const at::Half*>(a),
             data_.const_data_ptr<at::Half>() + off + k0 * nb, c, true);
      }
    }
  }
}

void release(bool vnni) {
#if STFAST_HAS_BRGEMM
  if (vnni) cpublas::brgemm_release(/*is_vnni=*/true);
#else
  (void)vnni;
#endif
}

void mm_packed(const at::Tensor& out, const at::Tensor& a, const PackedB& b, bool accumulate) {
  TORCH_CHECK(b.defined() && a.dim() == 2 && out.dim() == 2 && a.size(1) == b.K() && out.size(0) == a.size(0) &&
                  out.size(1) == b.N() && a.scalar_type() == b.dtype(),
              "stfast.gemm.brgemm: out ", out.sizes(), " = a ", a.sizes(), " (", a.scalar_type(), ") · B (", b.K(),
              ", ", b.N(), ") (", b.dtype(), ") does not fit");
  const int64_t R = a.size(0), N = b.N();
  if (R == 0 || N == 0) return;
  // not an ATen call: named for the profiler, so a profile counts these products as GEMMs
  RECORD_FUNCTION("stfast::brgemm", std::vector<c10::IValue>());
  // The kernel reads A row-major and writes C row-major; other layouts go through a copy.
  const at::Tensor A = a.stride(1) == 1 && a.stride(0) >= a.size(1) ? a : a.contiguous();
  const bool direct = out.scalar_type() == at::kFloat && out.stride(1) == 1 && out.stride(0) >= N;
  at::Tensor C = direct ? out : at::empty({R, N}, out.options().dtype(at::kFloat));
  const bool add_C = accumulate && direct;
  const int64_t lda = A.stride(0), ldc = C.stride(0), esize = static_cast<int64_t>(A.element_size());
  const char* a0 = static_cast<const char*>(A.const_data_ptr());
  float* c0 = C.data_ptr<float>();
  const int64_t row_tiles = (R + kTileM - 1) / kTileM, col_tiles = (N + kBlockN - 1) / kBlockN;
  // tiles of kTileM rows × one panel; a task's grain ~ 1 M multiply-adds (the fork's cost)
  const int64_t grain = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(1, kTileM * kBlockN * b.K()));
  at::parallel_for(0, row_tiles * col_tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = (t / col_tiles) * kTileM, j0 = (t % col_tiles) * kBlockN;
      const int64_t m = std::min(kTileM, R - r0), n1 = std::min(N, j0 + kBlockN);
      b.mm(c0 + r0 * ldc + j0, ldc, a0 + r0 * lda * esize, lda, m, add_C, j0, n1);
    }
    release(b.vnni());
  });
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
