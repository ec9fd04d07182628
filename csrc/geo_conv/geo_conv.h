// Per-element math of the fused geo-convolution, shared by the CPU and the CUDA kernels.
//
// DeepTTE's geo-conv front (Wang et al., AAAI 2018), per trip of L points:
//   h[p, i]  = tanh(b1[i] + sum_f W1[i, f] * x[p, f])                       (F_in -> H)
//   z[j, c]  = b2[c] + sum_{t < k} sum_{i < H} W2[c, i, t] * h[j + t, i]      (H -> C, no padding)
//   y[j, c]  = elu(z[j, c]);   out[j, :C] = y[j, :],  out[j, C] = local_dist[j]
// for j < L - k + 1. Trips are packed (CSR): trip b owns points offsets[b] .. offsets[b+1] - 1 and
// output rows offsets[b] - b (k - 1) .. offsets[b+1] - (b+1)(k - 1) - 1.
//
// Everything here is plain inline code: g++ compiles it for the CPU kernel, nvcc for the device,
// so the CPU tests check the same arithmetic (same operations, same summation order) the GPU runs.
// The kernels add only loops, launches and indexing. A is the accumulation type (float for
// float/half/bfloat16, double for double).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define STFAST_HD __host__ __device__ __forceinline__
#else
#define STFAST_HD inline
#endif

namespace stfast {
namespace geo_conv {

// tanh / expm1 through overloads that resolve to tanhf/expm1f for float and tanh/expm1 for double
// on both the host (std::) and the device (CUDA math library).
STFAST_HD float act_tanh(float x) { return ::tanhf(x); }
STFAST_HD double act_tanh(double x) { return ::tanh(x); }
STFAST_HD float act_expm1(float x) { return ::expm1f(x); }
STFAST_HD double act_expm1(double x) { return ::expm1(x); }

// Pre-activation of hidden unit i of one point: b1[i] + sum_f W1[i, f] x[f]; w_row = W1[i, :], F = F_in.
template <typename A, typename T, typename W>
STFAST_HD A hidden_preact(const T* x, const W* w_row, W bias, int64_t F) {
  A u = static_cast<A>(bias);
  for (int64_t f = 0; f < F; ++f) u += static_cast<A>(w_row[f]) * static_cast<A>(x[f]);
  return u;
}

// Hidden unit i of one point: tanh(hidden_preact).
template <typename A, typename T, typename W>
STFAST_HD A hidden_unit(const T* x, const W* w_row, W bias, int64_t F) {
  return act_tanh(hidden_preact<A>(x, w_row, bias, F));
}

// ELU (alpha = 1), as torch.nn.functional.elu.
template <typename A>
STFAST_HD A elu(A z) { return z > A(0) ? z : act_expm1(z); }

// d elu / d z expressed through the output y = elu(z): 1 where z > 0, exp(z) = y + 1 elsewhere.
template <typename A>
STFAST_HD A elu_grad_from_output(A y) { return y > A(0) ? A(1) : y + A(1); }

// d tanh / d u expressed through the output h = tanh(u).
template <typename A>
STFAST_HD A tanh_grad_from_output(A h) { return A(1) - h * h; }

// First output row of trip b: offsets[b] - b (k - 1).
STFAST_HD int64_t out_start(const int64_t* offsets, int64_t b, int64_t km1) { return offsets[b] - b * km1; }

// Trip of packed output row j (binary search; requires every trip to hold >= k - 1 points, so the
// output starts are non-decreasing). Returns b with out_start(b) <= j < out_start(b + 1).
STFAST_HD int64_t trip_of_output(const int64_t* offsets, int64_t B, int64_t km1, int64_t j) {
  int64_t lo = 0, hi = B - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (out_start(offsets, mid, km1) <= j) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Trip of packed point p: offsets[b] <= p < offsets[b + 1].
STFAST_HD int64_t trip_of_point(const int64_t* offsets, int64_t B, int64_t p) {
  int64_t lo = 0, hi = B - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= p) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace geo_conv
}  // namespace stfast
