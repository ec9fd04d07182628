// CUDA kernels of stfast::lstm_forward / stfast::lstm_backward (schemas in csrc/ops.cpp): the fused
// pointwise step, one thread per (alive row, hidden unit). The layer and time loops live in
// lstm_driver.h and issue the GEMMs through ATen (cuBLAS on the current stream, float accumulation for
// half/bfloat16); the per-element math is lstm.h, shared with the CPU kernel. Buffers come from the
// caching allocator; the only host->device transfer is the step plan's index arrays, copied
// asynchronously from pinned memory, so nothing waits on the device. Weight and bias gradients are
// GEMMs and a column sum over all positions (deterministic, no atomics). Half/bfloat16: gates and hidden
// states are stored in the input dtype, the cell state and its gradient in float32.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "lstm.h"
#include "lstm_driver.h"

namespace stfast {
namespace lstm {
namespace {

constexpr int kThreads = 256;

template <typename T, typename A>
__global__ void forward_step_kernel(T* __restrict__ gates, const T* __restrict__ bias, const A* __restrict__ c_prev,
                                    A* __restrict__ c, T* __restrict__ h, int64_t n, int64_t H) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H, j = e - r * H;
  T* g = gates + r * 4 * H + j;
  const T* b = bias + j;
  A i = static_cast<A>(g[0]) + static_cast<A>(b[0]), f = static_cast<A>(g[H]) + static_cast<A>(b[H]),
    gg = static_cast<A>(g[2 * H]) + static_cast<A>(b[2 * H]), o = static_cast<A>(g[3 * H]) + static_cast<A>(b[3 * H]);
  A cc, hh;
  cell_forward(i, f, gg, o, c_prev != nullptr ? c_prev[e] : A(0), cc, hh);
  g[0] = static_cast<T>(i);
  g[H] = static_cast<T>(f);
  g[2 * H] = static_cast<T>(gg);
  g[3 * H] = static_cast<T>(o);
  c[e] = cc;
  h[e] = static_cast<T>(hh);
}

template <typename T, typename A>
__global__ void backward_step_kernel(const T* __restrict__ gates, const A* __restrict__ c,
                                     const A* __restrict__ c_prev, const T* __restrict__ dh, A* __restrict__ dc,
                                     T* __restrict__ dgates, int64_t n, int64_t H) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H, j = e - r * H;
  const T* g = gates + r * 4 * H + j;
  T* dg = dgates + r * 4 * H + j;
  A dcc = dc[e], a_i, a_f, a_g, a_o;
  cell_backward<A>(static_cast<A>(g[0]), static_cast<A>(g[H]), static_cast<A>(g[2 * H]), static_cast<A>(g[3 * H]), c[e],
                   c_prev != nullptr ? c_prev[e] : A(0), static_cast<A>(dh[e]), dcc, a_i, a_f, a_g, a_o);
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

  static void add_recurrent_grad(at::Tensor out, const at::Tensor& dG, const at::Tensor& w_hh) {
    out.addmm_(dG, w_hh);
  }

  template <typename T, typename A>
  static void forward_step(T* gates, const T* bias, const A* c_prev, A* c, T* h, int64_t bs, int64_t H) {
    const int64_t n = bs * H;
    if (n == 0) return;
    forward_step_kernel<T, A><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        gates, bias, c_prev, c, h, n, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const T* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H) {
    const int64_t n = bs * H;
    if (n == 0) return;
    backward_step_kernel<T, A><<<blocks_for(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        gates, c, c_prev, dh, dc, dgates, n, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_forward_cuda(
    const at::Tensor& input, const at::Tensor& lengths, at::TensorList weights, const std::optional<at::Tensor>& h0,
    const std::optional<at::Tensor>& c0, int64_t num_layers, int64_t layout) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  const c10::cuda::CUDAGuard guard(input.device());
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lstm_forward_cuda", [&] {
    out = forward<scalar_t, at::opmath_type<scalar_t>, CudaBackend>(d, p, input, weights, h0, c0);
  });
  return out;
}

std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> lstm_backward_cuda(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input, const at::Tensor& lengths,
    at::TensorList weights, const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& gates, const at::Tensor& cells, const at::Tensor& hiddens, int64_t num_layers,
    int64_t layout, bool input_grad) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  check_saved(d, input, grad_output, grad_h_n, grad_c_n, gates, cells, hiddens);
  const c10::cuda::CUDAGuard guard(input.device());
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "lstm_backward_cuda", [&] {
    out = backward<scalar_t, at::opmath_type<scalar_t>, CudaBackend>(d, p, grad_output, grad_h_n, grad_c_n, input,
                                                                     weights, h0, c0, gates, cells, hiddens,
                                                                     input_grad);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(stfast, CUDA, m) {
  m.impl("lstm_forward", &lstm_forward_cuda);
  m.impl("lstm_backward", &lstm_backward_cuda);
}

}  // namespace lstm
}  // namespace stfast
