// The seam between stfast and oneDNN's batch-reduce micro-kernel (torch's at::native::cpublas::brgemm): every
// call of the kernel goes through here, to torch's kernel or to a reference that enforces the kernel's contract
// and multiplies exactly — as the CUDA emulator (csrc/emu) runs the CUDA kernels on a machine without a GPU, so
// that the 16-bit (AVX512-BF16, AMX) branches run, and are checked, in CI on any CPU, AVX2 included.
//
// The contract (oneDNN 3.x ukernel, as torch 2.14 drives it), checked on every call in both implementations:
//   C (M × N, row stride ldc, float32) (+)= A (M × K, row stride lda) · B;
//   float32: B row-major, K rows of stride ldb ≥ N;
//   bfloat16 / float16: B in VNNI-2 layout, B[K/2][ldb][2] (element (k, n) at (k/2)·2·ldb + 2·n + k%2), K even,
//   a panel width ldb of 16, 32, 48 or 64 (oneDNN packs and multiplies no other; "Transform routine supports only
//   'out_ld' of 16, 32, 48, or 64"), N ≤ ldb; a thread's run of 16-bit products configures its tiles (AMX) and is
//   closed by release() on that thread before the thread does anything else (TileScope).
// The reference sums each product in float64 and rounds it once to float32: exact for 16-bit operands up to the
// final rounding, which a hardware kernel's float32 sum must stay near (tests bound the difference).
//
// Which runs: STFAST_UKERNEL=torch (default) | reference, read once at start; set_impl() switches it between
// products (tests, stfast.ops.gemm.micro_kernel). The reference takes bfloat16 and float16 on any CPU, as a CPU
// with AMX-FP16 would.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace stfast {
namespace gemm {
namespace ukernel {

enum class Impl : int { kTorch = 0, kReference = 1 };

Impl impl();
void set_impl(Impl impl);
const char* impl_name(Impl impl);
Impl parse_impl(const char* name);  // "torch" | "reference"; ValueError otherwise

// Whether the kernel takes `operands` with a float32 output here and now: float32 where the torch build has the
// entry point; bfloat16 / float16 where a small exact self-check on the VNNI-2 layout passes (run once per
// implementation, dtype and torch.backends.mkldnn setting: a CPU without AVX512-BF16 / AMX refuses it, oneDNN
// disabled refuses it). Never decided by the CPU's name.
bool takes(c10::ScalarType operands);

// One tile product under the contract above (TORCH_CHECK names the broken term).
void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const float* A,
            const float* B, float* C);
void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C,
            const c10::BFloat16* A, const c10::BFloat16* B, float* C);
void brgemm(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, bool add_C, const c10::Half* A,
            const c10::Half* B, float* C);

// Releases this thread's tile configuration after a run of 16-bit products (torch's brgemm_release(true)).
void release();

// Scoped release: a run of 16-bit products on one thread, closed on every exit path, exceptions included.
class TileScope {
 public:
  explicit TileScope(bool vnni) : vnni_(vnni) {}
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  bool vnni_;
};

// Reference only: TORCH_CHECK that no thread holds a tile configuration (after a product's parallel region);
// `where` names the caller. A no-op for torch's kernel (its state is not observable).
void check_released(const char* where);

// For tests: the number of threads holding a reference tile configuration now.
int64_t configured_threads();

}  // namespace ukernel
}  // namespace gemm
}  // namespace stfast
