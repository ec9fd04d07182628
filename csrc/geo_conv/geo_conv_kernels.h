// The CUDA kernels of the fused geo-convolution and their launch arithmetic, in one header that nvcc
// (csrc/geo_conv/geo_conv_cuda.cu) and the host compiler (csrc/emu/emu_geo_conv.cpp, the CUDA emulator)
// both compile: the same kernels and the same grids, blocks, tiles and reduction groups on a GPU and in
// the CPU tests (issue 38). The per-element math is geo_conv.h, shared with the CPU kernel (same
// operations, same order); this file adds only indexing and launches.
//
// Weight gradients: per-tile partial sums, then a two-level reduction over the tiles in a fixed order
// (deterministic, no atomics). No launch has an empty grid: every size may be 0 (B, N, C, H, F), and a
// kernel whose grid would be empty is skipped.
//
// Launcher (csrc/common/cuda_launcher.cuh on a GPU, csrc/emu/emu_launcher.h in the emulator):
//   L.launch(name, kernel, grid, block, shared_bytes, args...)   one kernel launch
//   L.template workspace<U>(n)                                    an uninitialized device buffer of n U
//   L.sm_count()                                                  the device's multiprocessor count
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common/kernel.h"
#include "geo_conv.h"

namespace stfast {
namespace geo_conv {
namespace kernels {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // output rows / points per partial-sum tile

inline unsigned int blocks_for(int64_t n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }

// h[p, i] = tanh(b1[i] + W1[i, :] . x[p, :])
template <typename T, typename A>
__global__ void hidden_kernel(const T* __restrict__ x, const T* __restrict__ w1, const T* __restrict__ b1,
                              T* __restrict__ h, int64_t N, int64_t F, int64_t H) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * H) return;
  const int64_t p = idx / H, i = idx % H;
  h[idx] = static_cast<T>(hidden_unit<A>(x + p * F, w1 + i * F, b1[i], F));
}

// out[j, c] = elu(b2[c] + sum_t sum_i W2[c, i, t] h[p(j) + t, i]);  out[j, C] = local_dist[j]
template <typename T, typename A>
__global__ void conv_forward_kernel(const T* __restrict__ h, const int64_t* __restrict__ off,
                                    const T* __restrict__ ld, const T* __restrict__ w2, const T* __restrict__ b2,
                                    T* __restrict__ out, int64_t B, int64_t N, int64_t N_out, int64_t H, int64_t C,
                                    int64_t k) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N_out * (C + 1)) return;
  const int64_t j = idx / (C + 1), c = idx % (C + 1), km1 = k - 1;
  if (c == C) {
    out[idx] = ld[j];
    return;
  }
  const int64_t p = j + trip_of_output(off, B, km1, j) * km1;
  if (p < 0 || p + k > N) {  // a guard only: validated offsets never get here
    out[idx] = static_cast<T>(std::numeric_limits<A>::quiet_NaN());
    return;
  }
  A acc = static_cast<A>(b2[c]);
  for (int64_t t = 0; t < k; ++t)
    for (int64_t i = 0; i < H; ++i)
      acc += static_cast<A>(w2[(c * H + i) * k + t]) * static_cast<A>(h[(p + t) * H + i]);
  out[idx] = static_cast<T>(elu(acc));
}

// gz[j, c] = grad_out[j, c] * elu'(z[j, c])   (accumulation type)
template <typename T, typename A>
__global__ void elu_backward_kernel(const T* __restrict__ go, const T* __restrict__ y, A* __restrict__ gz,
                                    int64_t N_out, int64_t C) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N_out * C) return;
  const int64_t j = idx / C, c = idx % C;
  gz[idx] = static_cast<A>(go[j * (C + 1) + c]) * elu_grad_from_output(static_cast<A>(y[j * (C + 1) + c]));
}

// gu[p, i] = (sum_t sum_c W2[c, i, t] gz[j = p - t, c]) * (1 - h[p, i]^2), over the trip's windows
template <typename T, typename A>
__global__ void hidden_backward_kernel(const A* __restrict__ gz, const T* __restrict__ h,
                                       const int64_t* __restrict__ off, const T* __restrict__ w2, A* __restrict__ gu,
                                       int64_t B, int64_t N, int64_t H, int64_t C, int64_t k) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * H) return;
  const int64_t p = idx / H, i = idx % H, km1 = k - 1;
  const int64_t b = trip_of_point(off, B, p);
  const int64_t pl = p - off[b], Lo = off[b + 1] - off[b] - km1, o0 = out_start(off, b, km1);
  A gh = A(0);
  for (int64_t t = 0; t < k; ++t) {
    const int64_t j = pl - t;
    if (j < 0 || j >= Lo) continue;
    for (int64_t c = 0; c < C; ++c) gh += static_cast<A>(w2[(c * H + i) * k + t]) * gz[(o0 + j) * C + c];
  }
  gu[idx] = gh * tanh_grad_from_output(static_cast<A>(h[idx]));
}

// grad_points[p, f] = sum_i gu[p, i] W1[i, f]
template <typename T, typename A>
__global__ void points_backward_kernel(const A* __restrict__ gu, const T* __restrict__ w1, T* __restrict__ gx,
                                       int64_t N, int64_t F, int64_t H) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * F) return;
  const int64_t p = idx / F, f = idx % F;
  A s = A(0);
  for (int64_t i = 0; i < H; ++i) s += gu[p * H + i] * static_cast<A>(w1[i * F + f]);
  gx[idx] = static_cast<T>(s);
}

// Column sums of one tile with every thread busy: out[q] = sum over rows r < nrows (in row order
// within a slice) of term(q, r), for q < P. When P < blockDim, the block's threads form S = blockDim / P
// row slices per column (slice s sums rows s, s + S, ...), combined in slice order through shared memory
// (DeepTTE's projection has P = 80: one slice would idle 176 of 256 threads); otherwise each thread walks
// whole columns. The summation order depends only on P and nrows: deterministic.
template <typename A, typename Term>
__device__ void tile_column_sums(const Term& term, int64_t P, int64_t nrows, A* __restrict__ out) {
  STFAST_SHARED(A, slice_sums, kThreads);
  const int64_t S = P < kThreads ? kThreads / P : 1;
  if (S == 1) {
    for (int64_t q = threadIdx.x; q < P; q += blockDim.x) {
      A s = A(0);
      for (int64_t r = 0; r < nrows; ++r) s += term(q, r);
      out[q] = s;
    }
    return;
  }
  const int64_t t = threadIdx.x, slice = t / P, q = t % P;
  A s = A(0);
  if (slice < S)
    for (int64_t r = slice; r < nrows; r += S) s += term(q, r);
  slice_sums[t] = s;
  __syncthreads();
  if (t < P) {
    A total = A(0);
    for (int64_t k = 0; k < S; ++k) total += slice_sums[k * P + t];
    out[t] = total;
  }
}

// Term (q, r) of the conv partials: q < C·H·k -> dW2[c, i, t] += gz[j, c] h[p(j) + t, i]; else db2[c] += gz[j, c].
template <typename T, typename A>
struct ConvTerm {
  const A* __restrict__ gz;
  const T* __restrict__ h;
  const int64_t* first_point;  // shared memory: first point of each window of the tile
  int64_t j0, N, H, C, k;
  __device__ A operator()(int64_t q, int64_t r) const {
    const int64_t CHk = C * H * k;
    if (q >= CHk) return gz[(j0 + r) * C + (q - CHk)];
    const int64_t c = q / (H * k), i = (q / k) % H, t = q % k;
    const int64_t pt = first_point[r] + t;
    return pt >= 0 && pt < N ? gz[(j0 + r) * C + c] * static_cast<A>(h[pt * H + i]) : A(0);
  }
};

// Term (q, r) of the projection partials: q < H·F -> dW1[i, f] += gu[p, i] x[p, f]; else db1[i] += gu[p, i].
template <typename T, typename A>
struct ProjTerm {
  const A* __restrict__ gu;
  const T* __restrict__ x;
  int64_t p0, F, H;
  __device__ A operator()(int64_t q, int64_t r) const {
    const int64_t p = p0 + r;
    if (q >= H * F) return gu[p * H + (q - H * F)];
    return gu[p * H + q / F] * static_cast<A>(x[p * F + q % F]);
  }
};

// Per tile of kTile output rows: partial dW2 [C, H, k] and db2 [C] -> partials[tile, :].
template <typename T, typename A>
__global__ void conv_partials_kernel(const A* __restrict__ gz, const T* __restrict__ h,
                                     const int64_t* __restrict__ off, A* __restrict__ partials, int64_t B, int64_t N,
                                     int64_t N_out, int64_t H, int64_t C, int64_t k) {
  STFAST_SHARED(int64_t, first_point, kTile);
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile, km1 = k - 1;
  const int64_t nj = N_out - j0 < kTile ? N_out - j0 : static_cast<int64_t>(kTile);
  for (int64_t r = threadIdx.x; r < nj; r += blockDim.x)
    first_point[r] = j0 + r + trip_of_output(off, B, km1, j0 + r) * km1;
  __syncthreads();
  const int64_t P = C * H * k + C;
  tile_column_sums<A>(ConvTerm<T, A>{gz, h, first_point, j0, N, H, C, k}, P, nj,
                      partials + static_cast<int64_t>(blockIdx.x) * P);
}

// Per tile of kTile points: partial dW1 [H, F] and db1 [H] -> partials[tile, :].
template <typename T, typename A>
__global__ void proj_partials_kernel(const A* __restrict__ gu, const T* __restrict__ x, A* __restrict__ partials,
                                     int64_t N, int64_t F, int64_t H) {
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t np = N - p0 < kTile ? N - p0 : static_cast<int64_t>(kTile);
  const int64_t P = H * F + H;
  tile_column_sums<A>(ProjTerm<T, A>{gu, x, p0, F, H}, P, np, partials + static_cast<int64_t>(blockIdx.x) * P);
}

// Reduction, level 1: block (x, g) sums, for its kThreads columns, the tiles [g·T/G, (g+1)·T/G) in order
// -> mid[g, q].
template <typename A>
__global__ void reduce_groups_kernel(const A* __restrict__ partials, int64_t n_tiles, int64_t P, int64_t groups,
                                     A* __restrict__ mid) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= P) return;
  const int64_t g = blockIdx.y, t0 = g * n_tiles / groups, t1 = (g + 1) * n_tiles / groups;
  A s = A(0);
  for (int64_t tile = t0; tile < t1; ++tile) s += partials[tile * P + q];
  mid[g * P + q] = s;
}

// Reduction, last level: out[q] = sum over rows (in row order) of partials[row, q]; q < n_w -> weight, else bias.
template <typename T, typename A>
__global__ void reduce_partials_kernel(const A* __restrict__ partials, int64_t n_rows, int64_t n_w, int64_t P,
                                       T* __restrict__ gw, T* __restrict__ gb) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= P) return;
  A s = A(0);
  for (int64_t row = 0; row < n_rows; ++row) s += partials[row * P + q];
  if (q < n_w) gw[q] = static_cast<T>(s); else gb[q - n_w] = static_cast<T>(s);
}

// Number of level-1 groups for T tiles of P columns: enough blocks to give every SM about four
// (kBlocksPerSm), but at most ceil(sqrt(T)) groups, so that neither level walks more than ~sqrt(T) rows
// serially (one block walking all T tiles was latency-bound: ~1,500 dependent loads per thread at
// N ~ 1e5 rows). 1 = a single level. A function of T, P and the device's SM count only: the same
// summation order on every run on one GPU model.
constexpr int64_t kBlocksPerSm = 4;
inline int64_t reduction_groups(int64_t n_tiles, int64_t P, int64_t sms) {
  if (n_tiles <= 2 || P == 0) return 1;
  const int64_t col_blocks = blocks_for(P);
  const int64_t fill = (kBlocksPerSm * sms + col_blocks - 1) / col_blocks;
  const auto root = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n_tiles))));
  return std::max<int64_t>(1, std::min<int64_t>({fill, root, 65535}));  // 65535: gridDim.y's limit
}

// gw [n_w], gb [P - n_w] = column sums of partials [n_tiles, P] (two levels when that pays).
template <typename T, typename A, class Launcher>
void reduce_partials(Launcher& L, const A* partials, int64_t n_tiles, int64_t n_w, int64_t P, T* gw, T* gb) {
  if (P == 0) return;
  const int64_t groups = reduction_groups(n_tiles, P, L.sm_count());
  const A* rows = partials;
  int64_t n_rows = n_tiles;
  if (groups > 1) {
    A* mid = L.template workspace<A>(groups * P);
    L.launch("reduce_groups_kernel", reduce_groups_kernel<A>, dim3(blocks_for(P), static_cast<unsigned int>(groups)),
             dim3(kThreads), 0, partials, n_tiles, P, groups, mid);
    rows = mid;
    n_rows = groups;
  }
  L.launch("reduce_partials_kernel", reduce_partials_kernel<T, A>, dim3(blocks_for(P)), dim3(kThreads), 0, rows,
           n_rows, n_w, P, gw, gb);
}

// Forward of B > 0 trips (N > 0 points; validated offsets on the device): h (N, H), out (N_out, C + 1).
template <typename T, typename A, class Launcher>
void launch_forward(Launcher& L, int64_t B, int64_t N, int64_t N_out, int64_t F, int64_t H, int64_t C, int64_t k,
                    const T* x, const int64_t* off, const T* ld, const T* w1, const T* b1, const T* w2, const T* b2,
                    T* out, T* h) {
  if (N * H > 0)
    L.launch("hidden_kernel", hidden_kernel<T, A>, dim3(blocks_for(N * H)), dim3(kThreads), 0, x, w1, b1, h, N, F, H);
  L.launch("conv_forward_kernel", conv_forward_kernel<T, A>, dim3(blocks_for(N_out * (C + 1))), dim3(kThreads), 0, h,
           off, ld, w2, b2, out, B, N, N_out, H, C, k);
}

// Backward of B > 0 trips (N > 0, so N_out >= B >= 1 and both tile counts are >= 1): every gradient.
template <typename T, typename A, class Launcher>
void launch_backward(Launcher& L, int64_t B, int64_t N, int64_t N_out, int64_t F, int64_t H, int64_t C, int64_t k,
                     const T* go, const T* x, const int64_t* off, const T* h, const T* y, const T* w1, const T* w2,
                     T* gx, T* gw1, T* gb1, T* gw2, T* gb2) {
  A* gz = L.template workspace<A>(N_out * C);
  A* gu = L.template workspace<A>(N * H);
  const int64_t tiles_j = (N_out + kTile - 1) / kTile, tiles_p = (N + kTile - 1) / kTile;
  const int64_t P2 = C * H * k + C, P1 = H * F + H;
  A* part2 = L.template workspace<A>(tiles_j * P2);
  A* part1 = L.template workspace<A>(tiles_p * P1);
  if (C > 0) {
    L.launch("elu_backward_kernel", elu_backward_kernel<T, A>, dim3(blocks_for(N_out * C)), dim3(kThreads), 0, go, y,
             gz, N_out, C);
    L.launch("conv_partials_kernel", conv_partials_kernel<T, A>, dim3(static_cast<unsigned int>(tiles_j)),
             dim3(kThreads), 0, static_cast<const A*>(gz), h, off, part2, B, N, N_out, H, C, k);
  }
  if (H > 0) {
    L.launch("hidden_backward_kernel", hidden_backward_kernel<T, A>, dim3(blocks_for(N * H)), dim3(kThreads), 0,
             static_cast<const A*>(gz), h, off, w2, gu, B, N, H, C, k);
    L.launch("proj_partials_kernel", proj_partials_kernel<T, A>, dim3(static_cast<unsigned int>(tiles_p)),
             dim3(kThreads), 0, static_cast<const A*>(gu), x, part1, N, F, H);
  }
  if (F > 0)  // with H = 0 every term is empty: grad_points = 0
    L.launch("points_backward_kernel", points_backward_kernel<T, A>, dim3(blocks_for(N * F)), dim3(kThreads), 0,
             static_cast<const A*>(gu), w1, gx, N, F, H);
  reduce_partials<T, A>(L, static_cast<const A*>(part2), tiles_j, C * H * k, P2, gw2, gb2);
  reduce_partials<T, A>(L, static_cast<const A*>(part1), tiles_p, H * F, P1, gw1, gb1);
}

}  // namespace kernels
}  // namespace geo_conv
}  // namespace stfast
