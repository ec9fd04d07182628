// The emulator's own kernels, for its tests (tests/test_cuda_emulated.py): what it must catch, shown on
// kernels small enough to read.
//   selftest_shared_sum(x, sync): per block of 64 threads, out[b] = Σ_t x[64 b + t] through a shared array
//     (each thread writes its element, thread 0 sums); sync=false drops the barrier between, which a
//     sequential schedule turns into a poisoned (NaN) sum every time.
//   selftest_barrier(threads, returning): a block whose first `returning` threads return before a
//     __syncthreads() the others reach: an error naming the kernel, never a hang.
//   selftest_shared_site(calls): a device function that declares a shared array, called once to write it
//     and `calls` times more to read it: one copy per block, so out[t] = calls * ((t + 1) % 64).
//   selftest_barrier_sites(split): threads below `split` wait at one __syncthreads(), the rest at another:
//     an error naming both call sites (split 0: all at one, no error).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "emu_launcher.h"  // first: the kernel header below defines the device vocabulary as macros

#include "../common/kernel.h"

namespace stfast {
namespace emu {
namespace {

constexpr int kSelftestThreads = 64;

__global__ void selftest_shared_sum_kernel(const float* x, float* out, int64_t n, bool sync) {
  STFAST_SHARED(float, vals, kSelftestThreads);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  vals[threadIdx.x] = i < n ? x[i] : 0.0f;
  if (sync) __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int t = 0; t < kSelftestThreads; ++t) s += vals[t];
    out[blockIdx.x] = s;
  }
}

__global__ void selftest_barrier_kernel(float* out, int64_t returning) {
  if (static_cast<int64_t>(threadIdx.x) < returning) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__device__ float* selftest_scratch() {
  STFAST_SHARED(float, scratch, kSelftestThreads);
  return scratch;
}

__global__ void selftest_shared_site_kernel(float* out, int64_t calls) {
  selftest_scratch()[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  float s = 0.0f;
  for (int64_t c = 0; c < calls; ++c) s += selftest_scratch()[(threadIdx.x + 1) % kSelftestThreads];
  out[threadIdx.x] = s;
}

__global__ void selftest_barrier_sites_kernel(float* out, int64_t split) {
  if (static_cast<int64_t>(threadIdx.x) < split) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

at::Tensor selftest_shared_sum(const at::Tensor& x, bool sync) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat, "selftest_shared_sum: x must be 1-D float32");
  const auto xc = x.contiguous();
  const int64_t blocks = (x.numel() + kSelftestThreads - 1) / kSelftestThreads;
  EmuLauncher L(xc);
  at::Tensor out = L.empty({blocks}, xc.options());
  if (blocks > 0)
    L.launch("selftest_shared_sum_kernel", selftest_shared_sum_kernel, dim3(static_cast<unsigned int>(blocks)),
             dim3(kSelftestThreads), 0, xc.const_data_ptr<float>(), out.data_ptr<float>(), x.numel(), sync);
  return out;
}

at::Tensor selftest_barrier(int64_t threads, int64_t returning) {
  TORCH_CHECK(threads >= 1 && threads <= 1024, "selftest_barrier: threads must be 1..1024");
  at::Tensor out = at::zeros({threads}, at::kFloat);
  EmuLauncher L(out);
  L.launch("selftest_barrier_kernel", selftest_barrier_kernel, dim3(1), dim3(static_cast<unsigned int>(threads)), 0,
           out.data_ptr<float>(), returning);
  return out;
}

at::Tensor selftest_shared_site(int64_t calls) {
  TORCH_CHECK(calls >= 0, "selftest_shared_site: calls must be >= 0");
  at::Tensor out = at::zeros({kSelftestThreads}, at::kFloat);
  EmuLauncher L(out);
  L.launch("selftest_shared_site_kernel", selftest_shared_site_kernel, dim3(1), dim3(kSelftestThreads), 0,
           out.data_ptr<float>(), calls);
  return out;
}

at::Tensor selftest_barrier_sites(int64_t split) {
  at::Tensor out = at::zeros({kSelftestThreads}, at::kFloat);
  EmuLauncher L(out);
  L.launch("selftest_barrier_sites_kernel", selftest_barrier_sites_kernel, dim3(1), dim3(kSelftestThreads), 0,
           out.data_ptr<float>(), split);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(stfast_emu, m) {
  m.def("selftest_shared_site(int calls) -> Tensor", &selftest_shared_site);
  m.def("selftest_barrier_sites(int split) -> Tensor", &selftest_barrier_sites);
  m.def("selftest_shared_sum(Tensor x, bool sync) -> Tensor", &selftest_shared_sum);
  m.def("selftest_barrier(int threads, int returning) -> Tensor", &selftest_barrier);
}

}  // namespace emu
}  // namespace stfast
