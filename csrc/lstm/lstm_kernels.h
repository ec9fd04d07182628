// The CUDA kernels of the fused LSTM's pointwise steps and their launches, in one header that nvcc
// (csrc/lstm/lstm_cuda.cu) and the host compiler (csrc/emu/emu_lstm.cpp, the CUDA emulator) both compile
// (issue 38): one thread per (alive row, hidden unit); the per-element math is lstm.h, shared with the CPU
// kernel. The layer and time loops and the GEMMs are lstm_driver.h's.
//
// Launcher: L.launch(name, kernel, grid, block, shared_bytes, args...) (csrc/common/cuda_launcher.cuh,
// csrc/emu/emu_launcher.h).
#pragma once

#include <cstdint>

#include "../common/kernel.h"
#include "lstm.h"

namespace stfast {
namespace lstm {
namespace kernels {

constexpr int kThreads = 256;

inline unsigned int blocks_for(int64_t n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }

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

// Backend::forward_step of lstm_driver.h: bs rows of H units.
template <typename T, typename A, class Launcher>
void launch_forward_step(Launcher& L, T* gates, const A* pre, const A* rec, const A* bias, const A* c_prev, A* c,
                         T* h, int64_t bs, int64_t H) {
  const int64_t n = bs * H;
  if (n == 0) return;  // B = 0 or H = 0: nothing to do, and a zero-block grid is a launch error
  L.launch("forward_step_kernel", forward_step_kernel<T, A>, dim3(blocks_for(n)), dim3(kThreads), 0, gates, pre, rec,
           bias, c_prev, c, h, n, H);
}

// Backend::backward_step of lstm_driver.h.
template <typename T, typename A, class Launcher>
void launch_backward_step(Launcher& L, const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates,
                          int64_t bs, int64_t H) {
  const int64_t n = bs * H;
  if (n == 0) return;
  L.launch("backward_step_kernel", backward_step_kernel<T, A>, dim3(blocks_for(n)), dim3(kThreads), 0, gates, c,
           c_prev, dh, dc, dgates, n, H);
}

}  // namespace kernels
}  // namespace lstm
}  // namespace stfast
