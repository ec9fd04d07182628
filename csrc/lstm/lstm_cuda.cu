// CUDA kernels of stfast::lstm_forward / stfast::lstm_backward (schemas in csrc/ops.cpp): the fused
// pointwise step, one thread per (alive row, hidden unit). The layer and time loops live in
// lstm_driver.h and issue the GEMMs through ATen (cuBLAS on the current stream, float accumulation for
// half/bfloat16); the per-element math is lstm.h, shared with the CPU kernel. Buffers come from the
// caching allocator; the only host->device transfer is the step plan's index arrays, copied
// asynchronously from pinned memory, so nothing waits on the device. Weight and bias gradients are
// GEMMs and a column sum over all positions (deterministic, no atomics). Half/bfloat16: gates (the
// activations), hidden states and dG are stored in the input dtype; the pre-activations, the cell state,
// dH and dc in float32, every GEMM with float output (lstm_driver.h, "Precision").
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <limits>

#include "lstm.h"
#include "lstm_driver.h"

namespace stfast {
namespace lstm {
namespace {

constexpr int kThreads = 256;

// gates may alias pre (T == A: the activations overwrite the pre-activations in place): not __restrict__.
template <typename T, typename A>
__global__ void forward_step_kernel(T* gates, const A* pre, const A* __restrict__ rec, const A* __restrict__ bias,
                                    const A* __restrict__ c_prev, A* __restrict__ c, T* __restrict__ h, int64_t n,
                                    int64_t H) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H, j = e - r * H;
  const int64_t base = r * 4 * H + j;
  A a[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    a[u] = pre[base + u * H];
    if (rec != nullptr) a[u] += rec[base + u * H];
    a[u] += bias[j + u * H];
  }
  A cc, hh;
  cell_forward(a[0], a[1], a[2], a[3], c_prev != nullptr ? c_prev[e] : A(0), cc, hh);
#pragma unroll
  for (int u = 0; u < 4; ++u) gates[base + u * H] = static_cast<T>(a[u]);
  c[e] = cc;
  h[e] = static_cast<T>(hh);
}

template <typename T, typename A>
__global__ void backward_step_kernel(const T* __restrict__ gates, const A* __restrict__ c,
                                     const A* __restrict__ c_prev, const A* __restrict__ dh, A* __restrict__ dc,
                                     T* __restrict__ dgates, int64_t n, int64_t H) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H, j = e - r * H;
  const T* g = gates + r * 4 * H + j;
  T* dg = dgates + r * 4 * H + j;
  A dcc = dc[e], a_i, a_f, a_g, a_o;
  cell_backward<A>(static_cast<A>(g[0]), static_cast<A>(g[H]), static_cast<A>(g[2 * H]), static_cast<A>(g[3 * H]), c[e],
                   c_prev != nullptr ? c_prev[e] : A(0), dh[e], dcc, a_i, a_f, a_g, a_o);
  dc[e] = dcc;
  dg[0] = static_cast<T>(a_i);
  dg[H] = static_cast<T>(a_f);
  dg[2 * H] = static_cast<T>(a_g);
  dg[3 * H] = static_cast<T>(a_o);
}

inline unsigned int blocks_for(int64_t n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }

struct CudaBackend {
  static constexpr int64_t kGemmRowBlock = std::numeric_limits<int64_t>::max();  // cuBLAS: one GEMM

  static at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& opt) { return at::empty(sizes, opt); }

  // out (=, or += with accumulate) a · b. float16/bfloat16 operands with a float out: cuBLAS with float
  // output and compute type (mm's out_dtype overload), never a half result. Why no addmm with out_dtype:
  // some torch releases require its `self` in the operands' dtype, so the sum goes through a float temporary.
  static void mm(at::Tensor out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
    if (out.numel() == 0) return;  // also no zero-block launches inside cuBLAS wrappers
    if (a.scalar_type() == out.scalar_type()) {
      if (accumulate) out.addmm_(a, b);
      else at::mm_out(out, a, b);
    } else if (accumulate) {
      out.add_(at::mm(a, b, out.scalar_type()));
    } else {
      at::mm_out(out, a, b, out.scalar_type());
    }
  }

  static void add_recurrent_grad(at::Tensor out, const at::Tensor& dG, const at::Tensor& w_hh) {
    mm(out, dG, w_hh, /*accumulate=*/true);
  }

  template <typename T, typename A>
  static void forward_step(T* gates, const A* pre, const A* rec, const A* bias, const A* c_prev, A* c, T* h,
                           int64_t bs, int64_t H) {
    const int64_t n = bs * H;
    if (n == 0) return;  // B = 0 or H = 0: nothing to do, and a zero-block grid is a launch error
    forward_step_kernel<T, A><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        gates, pre, rec, bias, c_prev, c, h, n, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H) {
    const int64_t n = bs * H;
    if (n == 0) return;
    backward_step_kernel<T, A><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        gates, c, c_prev, dh, dc, dgates, n, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

// Checks, plan and dtype dispatch: lstm_driver.h's run_forward / run_backward, the same code as the CPU's.
TORCH_LIBRARY_IMPL(stfast, CUDA, m) {
  m.impl("lstm_forward", &run_forward<CudaBackend>);
  m.impl("lstm_backward", &run_backward<CudaBackend>);
}

}  // namespace lstm
}  // namespace stfast
