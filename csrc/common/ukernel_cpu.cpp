// The micro-kernel seam (ukernel.h): torch's cpublas::brgemm, or the reference that enforces its contract.
#include "ukernel.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace stfast {
namespace gemm {
namespace ukernel {
namespace {

namespace cpublas = at::native::cpublas;

// The torch built against has the float32 and 16-bit micro-kernel entry points (ATen/native/CPUBlas.h names them
// by these macros); an older torch builds the torch side out: only the reference takes anything then.
#if defined(CPUBLAS_BRGEMM_F32F32F32) && defined(CPUBLAS_BRGEMM_BF16BF16F32) && defined(CPUBLAS_BRGEMM_F16F16F32)
#define STFAST_HAS_BRGEMM 1
#else
#define STFAST_HAS_BRGEMM 0
#endif

Impl read_env() {
  const char* env = std::getenv("STFAST_UKERNEL");
  return env == nullptr || *env == '\0' ? Impl::kTorch : parse_impl(env);
}

std::atomic<int>& current() {
  static std::atomic<int> c{static_cast<int>(read_env())};
  return c;
}

// Reference tile state: whether this thread holds a configuration, and how many threads do.
thread_local bool t_configured = false;
std::atomic<int64_t> g_configured{0};

void check_common(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldc) {
  TORCH_CHECK(M > 0 && N > 0 && K > 0, "stfast.ukernel: empty product M ", M, " N ", N, " K ", K,
              " (callers skip empty products)");
  TORCH_CHECK(lda >= K && ldc >= N, "stfast.ukernel: lda ", lda, " < K ", K, " or ldc ", ldc, " < N ", N);
}

void check_vnni(int64_t N, int64_t K, int64_t ldb) {
  TORCH_CHECK(K % 2 == 0, "stfast.ukernel: a 16-bit product needs an even K (VNNI-2 pairs rows), got ", K);
  TORCH_CHECK(ldb == 16 || ldb == 32 || ldb == 48 || ldb == 64,
              "stfast.ukernel: a 16-bit panel must be 16, 32, 48 or 64 columns wide (oneDNN's packed widths), got ",
              ldb);
  TORCH_CHECK(N <= ldb, "stfast.ukernel: N ", N, " exceeds the panel width ", ldb);
}

template <typename T>
double as_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}

// C (+)= A · B summed in float64, rounded once; vnni: B as B[K/2][ldb][2].
template <typename T>
void reference(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const T* A,
               const T* B, float* C, bool vnni) {
  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) row[n] = add_C ? static_cast<double>(C[m * ldc + n]) : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double a = as_double(A[m * lda + k]);
      const T* b = vnni ? B + (k / 2) * 2 * ldb + (k % 2) : B + k * ldb;
      const int64_t step = vnni ? 2 : 1;
      for (int64_t n = 0; n < N; ++n) row[n] += a * as_double(b[n * step]);
    }
    for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = static_cast<float>(row[n]);
  }
}

template <typename T>
void brgemm16(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const T* A,
              const T* B, float* C) {
  check_common(M, N, K, lda, ldc);
  check_vnni(N, K, ldb);
  if (impl() == Impl::kReference) {
    if (!t_configured) {  // the first 16-bit product of a run configures this thread's tiles
      t_configured = true;
      g_configured.fetch_add(1);
    }
    reference(M, N, K, lda, ldb, ldc, add_C, A, B, C, /*vnni=*/true);
    return;
  }
#if STFAST_HAS_BRGEMM
  cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, B, C, /*is_vnni=*/true);
#else
  TORCH_CHECK(false, "stfast.ukernel: this torch has no cpublas::brgemm");
#endif
}

// The exact self-check behind takes(): a 2 × 16 × 4 product of small integers (exact in every 16-bit format) on
// the VNNI-2 layout, compared bit for bit; any error (c10::Error, dnnl::error, ...) means "not taken".
template <typename T>
bool self_check() {
  constexpr int64_t M = 2, N = 16, K = 4;
  std::array<T, M * K> a;
  std::array<T, K * N> b;  // VNNI-2
  std::array<float, M * N> c{}, want{};
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) a[m * K + k] = static_cast<T>(static_cast<float>((m + 1) * (k + 1) - 3));
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      const float v = static_cast<float>((k * 7 + n * 3) % 11 - 5);
      b[(k / 2) * 2 * N + 2 * n + k % 2] = static_cast<T>(v);
      for (int64_t m = 0; m < M; ++m) want[m * N + n] += static_cast<float>(a[m * K + k]) * v;
    }
  }
  try {
    const TileScope tiles(true);
    brgemm16<T>(M, N, K, K, N, N, false, a.data(), b.data(), c.data());
  } catch (const std::exception&) {
    return false;
  }
  return std::memcmp(c.data(), want.data(), sizeof(float) * M * N) == 0;
}

}  // namespace

Impl impl() { return static_cast<Impl>(current().load(std::memory_order_relaxed)); }

void set_impl(Impl i) { current().store(static_cast<int>(i)); }

const char* impl_name(Impl i) { return i == Impl::kReference ? "reference" : "torch"; }

Impl parse_impl(const char* name) {
  const std::string s(name);
  if (s == "torch") return Impl::kTorch;
  if (s == "reference") return Impl::kReference;
  TORCH_CHECK_VALUE(false, "STFAST_UKERNEL must be 'torch' or 'reference', got '", s, "'");
}

bool takes(c10::ScalarType operands) {
  const bool reference = impl() == Impl::kReference;
  if (operands == c10::kFloat) return reference || STFAST_HAS_BRGEMM;
  const int d = operands == c10::kBFloat16 ? 0 : operands == c10::kHalf ? 1 : -1;
  if (d < 0) return false;
  // oneDNN disabled (torch.backends.mkldnn): torch's 16-bit kernel refuses to run; the reference follows it
  if (!at::globalContext().userEnabledMkldnn()) return false;
  static std::array<std::atomic<int>, 4> known{};  // (impl, dtype): 0 unknown, 1 no, 2 yes
  std::atomic<int>& k = known[static_cast<size_t>(2 * (reference ? 1 : 0) + d)];
  int v = k.load();
  if (v == 0) {
    v = (d == 0 ? self_check<c10::BFloat16>() : self_check<c10::Half>()) ? 2 : 1;
    k.store(v);
  }
  return v == 2;
}

void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const float* A,
            const float* B, float* C) {
  check_common(M, N, K, lda, ldc);
  TORCH_CHECK(ldb >= N, "stfast.ukernel: ldb ", ldb, " < N ", N);
  if (impl() == Impl::kReference) return reference(M, N, K, lda, ldb, ldc, add_C, A, B, C, /*vnni=*/false);
#if STFAST_HAS_BRGEMM
  cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A, B, C, /*is_vnni=*/false);
#else
  TORCH_CHECK(false, "stfast.ukernel: this torch has no cpublas::brgemm");
#endif
}

void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C,
            const c10::BFloat16* A, const c10::BFloat16* B, float* C) {
  brgemm16(M, N, K, lda, ldb, ldc, add_C, A, B, C);
}

void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const c10::Half* A,
            const c10::Half* B, float* C) {
  brgemm16(M, N, K, lda, ldb, ldc, add_C, A, B, C);
}

void release() {
  if (t_configured) {  // reference state (released whichever implementation is current now)
    t_configured = false;
    g_configured.fetch_sub(1);
  }
  if (impl() == Impl::kTorch) {
#if STFAST_HAS_BRGEMM
    cpublas::brgemm_release(/*is_vnni=*/true);
#endif
  }
}

TileScope::~TileScope() {
  if (!vnni_) return;
  try {
    release();
  } catch (const std::exception&) {  // a destructor must not throw; the next product configures afresh
  }
}

void check_released(const char* where) {
  const int64_t n = g_configured.load();
  TORCH_CHECK(n == 0, "stfast.ukernel: ", n, " thread(s) still hold a tile configuration after ", where,
              " (every run of 16-bit products must end in release() on its thread)");
}

int64_t configured_threads() { return g_configured.load(); }

}  // namespace ukernel
}  // namespace gemm
}  // namespace stfast
