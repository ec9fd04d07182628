// Per-element math of the fused LSTM, shared by the CPU and the CUDA kernels (see stfast/ops/lstm.py).
//
// One LSTM cell element j of one sequence at one step (torch.nn.LSTM's gate order i, f, g, o):
//   i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o)          (a = pre-activations, 4 of them)
//   c = f c_prev + i g,   h = o tanh(c)
// and its backward through time, given dh (from the output and from the next step's recurrent GEMM)
// and dc (from the next step):
//   dc' = dc + dh o (1 − tanh²c)
//   da_o = dh tanh(c) o (1 − o),  da_i = dc' g i (1 − i),  da_g = dc' i (1 − g²),  da_f = dc' c_prev f (1 − f)
//   dc_prev = dc' f
// Everything is plain inline code over the accumulation type A (float for float/half/bfloat16, double
// for double): g++ compiles it into the CPU loops (vectorized through glibc's libmvec), nvcc into the
// CUDA kernels, so the CPU tests check the arithmetic the GPU runs.
#pragma once

#include <cmath>

#ifndef STFAST_HD
#if defined(__CUDACC__) || defined(__HIPCC__)
#define STFAST_HD __host__ __device__ __forceinline__
#else
#define STFAST_HD inline
#endif
#endif

namespace stfast {
namespace lstm {

STFAST_HD float lstm_tanh(float x) { return ::tanhf(x); }
STFAST_HD double lstm_tanh(double x) { return ::tanh(x); }

// σ(x) = (1 + tanh(x / 2)) / 2: one transcendental function for all four gates, and no overflow of
// exp(−x) for large negative x (the CPU kernels are compiled with -ffast-math, which assumes no infinities).
template <typename A>
STFAST_HD A sigmoid(A x) { return A(0.5) * lstm_tanh(A(0.5) * x) + A(0.5); }

// Forward of one element: the pre-activations i, f, g, o are replaced by the activations; c and h out.
template <typename A>
STFAST_HD void cell_forward(A& i, A& f, A& g, A& o, A c_prev, A& c, A& h) {
  i = sigmoid(i);
  f = sigmoid(f);
  g = lstm_tanh(g);
  o = sigmoid(o);
  c = f * c_prev + i * g;
  h = o * lstm_tanh(c);
}

// Backward of one element from the saved activations i, f, g, o and cell c (tanh(c) is recomputed).
// dc: in, the cell gradient from the next step; out, the gradient into c_prev. da_*: pre-activation grads.
template <typename A>
STFAST_HD void cell_backward(A i, A f, A g, A o, A c, A c_prev, A dh, A& dc, A& da_i, A& da_f, A& da_g, A& da_o) {
  const A tc = lstm_tanh(c);
  const A dct = dc + dh * o * (A(1) - tc * tc);
  da_o = dh * tc * o * (A(1) - o);
  da_i = dct * g * i * (A(1) - i);
  da_g = dct * i * (A(1) - g * g);
  da_f = dct * c_prev * f * (A(1) - f);
  dc = dct * f;
}

}  // namespace lstm
}  // namespace stfast
