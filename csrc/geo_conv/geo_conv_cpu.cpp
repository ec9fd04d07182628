// CPU kernels of stfast::geo_conv_forward / stfast::geo_conv_backward (schemas in csrc/ops.cpp).
// Per-element math lives in geo_conv.h (shared with the CUDA kernels); this file holds the loops.
//
// Parallelism: at::parallel_for over fixed chunks of kTripsPerChunk trips. Weight gradients are
// summed per chunk into a partials buffer [n_chunks, P] and then reduced over chunks in chunk order,
// so the result does not depend on the number of threads (deterministic, no atomics).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <vector>

#include "geo_conv.h"
#include "geo_conv_checks.h"

namespace stfast {
namespace geo_conv {
namespace {

constexpr int64_t kTripsPerChunk = 4;

// One output row: y[c] = ELU(b2[c] + Σ_r hw[r] · wt[r][c]) over the window's k·H hidden values (wt is
// the conv weight as [k·H][C]), then the local-distance column. `a` is C accumulators of scratch.
template <typename T, typename A>
inline void conv_window(const T* __restrict__ hw, const A* __restrict__ wt, const T* __restrict__ b2, int64_t KH,
                        int64_t C, A* __restrict__ a, T* __restrict__ y, T local_dist) {
  for (int64_t c = 0; c < C; ++c) a[c] = static_cast<A>(b2[c]);
  for (int64_t r = 0; r < KH; ++r) {
    const A v = static_cast<A>(hw[r]);
    const A* __restrict__ wr = wt + r * C;
    for (int64_t c = 0; c < C; ++c) a[c] += wr[c] * v;
  }
  for (int64_t c = 0; c < C; ++c) y[c] = static_cast<T>(elu(a[c]));
  y[C] = local_dist;
}

template <typename T>
void forward_kernel(const Dims& d, const T* x, const int64_t* off, const T* ld, const T* w1, const T* b1,
                    const T* w2, const T* b2, T* out, T* h) {
  using A = at::opmath_type<T>;  // float for float16 / bfloat16 storage
  const int64_t F = d.F, H = d.H, C = d.C, k = d.k, km1 = k - 1, KH = k * H;
  // W2 transposed to [t][i][c]: the inner loop over output channels is contiguous (vectorizes).
  std::vector<A> w2t(KH * C);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t t = 0; t < k; ++t) w2t[(t * H + i) * C + c] = w2[(c * H + i) * k + t];
  const int64_t n_chunks = (d.B + kTripsPerChunk - 1) / kTripsPerChunk;
  at::parallel_for(0, n_chunks, 1, [&](int64_t ch0, int64_t ch1) {
    std::vector<A> acc(C);
    const A* __restrict__ wt = w2t.data();
    for (int64_t b = ch0 * kTripsPerChunk; b < std::min(d.B, ch1 * kTripsPerChunk); ++b) {
      const int64_t n0 = off[b], L = off[b + 1] - n0, Lo = L - km1, o0 = out_start(off, b, km1);
      // hidden_unit split in two loops so that tanh runs over a flat array (vectorized, libmvec).
      for (int64_t p = n0; p < n0 + L; ++p)
        for (int64_t i = 0; i < H; ++i) h[p * H + i] = static_cast<T>(hidden_preact<A>(x + p * F, w1 + i * F, b1[i], F));
      T* __restrict__ hh = h + n0 * H;
      for (int64_t e = 0; e < L * H; ++e) hh[e] = act_tanh(hh[e]);
      for (int64_t j = 0; j < Lo; ++j) {
        // the k points of window j are contiguous rows
        conv_window<T, A>(h + (n0 + j) * H, wt, b2, KH, C, acc.data(), out + (o0 + j) * (C + 1), ld[o0 + j]);
      }
    }
  });
}

template <typename T>
void backward_kernel(const Dims& d, const T* go, const T* x, const int64_t* off, const T* h, const T* y,
                     const T* w1, const T* w2, T* gx, T* gw1, T* gb1, T* gw2, T* gb2) {
  using A = at::opmath_type<T>;  // float for float16 / bfloat16 storage
  const int64_t F = d.F, H = d.H, C = d.C, k = d.k, km1 = k - 1, KH = k * H;
  // Partials layout per chunk: [dW2 as [t][i][c] | db2 [C] | dW1 [H][F] | db1 [H]].
  const int64_t P_W2 = 0, P_B2 = KH * C, P_W1 = P_B2 + C, P_B1 = P_W1 + H * F, P = P_B1 + H;
  std::vector<A> w2g(k * C * H);  // W2 as [t][c][i]: the point gradient's inner loop runs over i
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t t = 0; t < k; ++t) w2g[(t * C + c) * H + i] = w2[(c * H + i) * k + t];
  const int64_t n_chunks = (d.B + kTripsPerChunk - 1) / kTripsPerChunk;
  std::vector<A> partials(n_chunks * P, A(0));
  at::parallel_for(0, n_chunks, 1, [&](int64_t ch0, int64_t ch1) {
    std::vector<A> gz, gh(H), gu(H);
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      A* __restrict__ part = partials.data() + ch * P;
      for (int64_t b = ch * kTripsPerChunk; b < std::min(d.B, (ch + 1) * kTripsPerChunk); ++b) {
        const int64_t n0 = off[b], L = off[b + 1] - n0, Lo = L - km1, o0 = out_start(off, b, km1);
        gz.resize(Lo * C);
        // Output positions: dz = dy * elu'(z); conv weight and bias gradients (outer products).
        for (int64_t j = 0; j < Lo; ++j) {
          const T* __restrict__ g = go + (o0 + j) * (C + 1);
          const T* __restrict__ yy = y + (o0 + j) * (C + 1);
          A* __restrict__ z = gz.data() + j * C;
          for (int64_t c = 0; c < C; ++c) z[c] = static_cast<A>(g[c]) * elu_grad_from_output(static_cast<A>(yy[c]));
          A* __restrict__ pb = part + P_B2;
          for (int64_t c = 0; c < C; ++c) pb[c] += z[c];
          const T* __restrict__ hw = h + (n0 + j) * H;
          for (int64_t r = 0; r < KH; ++r) {
            const A v = static_cast<A>(hw[r]);
            A* __restrict__ pw = part + P_W2 + r * C;
            for (int64_t c = 0; c < C; ++c) pw[c] += v * z[c];
          }
        }
        // Points: dh gathered from the (up to k) windows that contain the point, then through tanh
        // and the projection.
        for (int64_t p = 0; p < L; ++p) {
          A* __restrict__ ghp = gh.data();
          for (int64_t i = 0; i < H; ++i) ghp[i] = A(0);
          for (int64_t t = 0; t < k; ++t) {
            const int64_t j = p - t;
            if (j < 0 || j >= Lo) continue;
            const A* __restrict__ z = gz.data() + j * C;
            for (int64_t c = 0; c < C; ++c) {
              const A zc = z[c];
              const A* __restrict__ wg = w2g.data() + (t * C + c) * H;
              for (int64_t i = 0; i < H; ++i) ghp[i] += wg[i] * zc;
            }
          }
          const T* __restrict__ hp = h + (n0 + p) * H;
          const T* __restrict__ xp = x + (n0 + p) * F;
          for (int64_t i = 0; i < H; ++i) gu[i] = ghp[i] * tanh_grad_from_output(static_cast<A>(hp[i]));
          for (int64_t f = 0; f < F; ++f) {
            A s = A(0);
            for (int64_t i = 0; i < H; ++i) s += gu[i] * static_cast<A>(w1[i * F + f]);
            gx[(n0 + p) * F + f] = static_cast<T>(s);
          }
          for (int64_t i = 0; i < H; ++i) {
            part[P_B1 + i] += gu[i];
            for (int64_t f = 0; f < F; ++f) part[P_W1 + i * F + f] += gu[i] * static_cast<A>(xp[f]);
          }
        }
      }
    }
  });
  // Second pass: reduce the partials over chunks, in chunk order, per parameter.
  at::parallel_for(0, P, 256, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      A s = A(0);
      for (int64_t ch = 0; ch < n_chunks; ++ch) s += partials[ch * P + q];
      if (q < P_B2) {
        const int64_t r = q / C, c = q % C, t = r / H, i = r % H;
        gw2[(c * H + i) * k + t] = static_cast<T>(s);
      } else if (q < P_W1) {
        gb2[q - P_B2] = static_cast<T>(s);
      } else if (q < P_B1) {
        gw1[q - P_W1] = static_cast<T>(s);
      } else {
        gb1[q - P_B1] = static_cast<T>(s);
      }
    }
  });
}

// ---- Specialized kernels for compile-time H and C (DeepTTE: H = 16, C = 32) ----
// Same arithmetic and the same per-element summation order as the generic kernels above (so results
// match them bit for bit up to FMA contraction), but the channel loops have constant trip counts, so the
// accumulators of a window (C values) or of a point (H values) live in vector registers, and the
// conv-weight gradient keeps a block of its rows in registers over all windows of a trip.

// 32-byte GCC vector types (one AVX register; plain SSE pairs or scalar code elsewhere) and unaligned
// load/store through memcpy.
template <typename A>
struct VecOf {
  typedef A type __attribute__((vector_size(32)));
  static constexpr int64_t width = 32 / sizeof(A);
};
template <typename A>
inline typename VecOf<A>::type vload(const A* p) {
  typename VecOf<A>::type v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename A>
inline void vstore(A* p, typename VecOf<A>::type v) { __builtin_memcpy(p, &v, sizeof(v)); }

template <typename T, int64_t H, int64_t C>
void forward_kernel_fixed(const Dims& d, const T* x, const int64_t* off, const T* ld, const T* w1, const T* b1,
                          const T* w2, const T* b2, T* out, T* h) {
  using A = at::opmath_type<T>;  // float for float16 / bfloat16 storage
  using V = typename VecOf<A>::type;
  constexpr int64_t W = VecOf<A>::width, NC = C / W;
  static_assert(C % W == 0, "fixed kernels need C a multiple of the vector width");
  const int64_t F = d.F, k = d.k, km1 = k - 1, KH = k * H;
  std::vector<A> b2c(b2, b2 + C);
  const A* b2v = b2c.data();
  std::vector<A> w2t(KH * C);  // [t][i][c]
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t t = 0; t < k; ++t) w2t[(t * H + i) * C + c] = w2[(c * H + i) * k + t];
  std::vector<A> w1t(F * H);  // [f][i]
  for (int64_t i = 0; i < H; ++i)
    for (int64_t f = 0; f < F; ++f) w1t[f * H + i] = w1[i * F + f];
  const int64_t n_chunks = (d.B + kTripsPerChunk - 1) / kTripsPerChunk;
  at::parallel_for(0, n_chunks, 1, [&](int64_t ch0, int64_t ch1) {
    const A* __restrict__ wt = w2t.data();
    const A* __restrict__ w1tp = w1t.data();
    for (int64_t b = ch0 * kTripsPerChunk; b < std::min(d.B, ch1 * kTripsPerChunk); ++b) {
      const int64_t n0 = off[b], L = off[b + 1] - n0, Lo = L - km1, o0 = out_start(off, b, km1);
      // Projection: bias, then the F features in order (hidden_preact's order), vectorized over i.
      for (int64_t p = n0; p < n0 + L; ++p) {
        A u[H];
        for (int64_t i = 0; i < H; ++i) u[i] = static_cast<A>(b1[i]);
        const T* __restrict__ xp = x + p * F;
        for (int64_t f = 0; f < F; ++f) {
          const A xf = static_cast<A>(xp[f]);
          for (int64_t i = 0; i < H; ++i) u[i] += w1tp[f * H + i] * xf;
        }
        T* __restrict__ hp = h + p * H;
        for (int64_t i = 0; i < H; ++i) hp[i] = static_cast<T>(u[i]);
      }
      T* __restrict__ hh = h + n0 * H;
      for (int64_t e = 0; e < L * H; ++e) hh[e] = act_tanh(hh[e]);
      int64_t j = 0;
      for (; j + 2 <= Lo; j += 2) {  // two windows at a time share the weight loads
        const T* __restrict__ hw0 = h + (n0 + j) * H;
        const T* __restrict__ hw1 = hw0 + H;
        V v0s[NC], v1s[NC];
        for (int64_t q = 0; q < NC; ++q) v0s[q] = v1s[q] = vload(b2v + q * W);
        for (int64_t r = 0; r < KH; ++r) {
          const A v0 = static_cast<A>(hw0[r]), v1 = static_cast<A>(hw1[r]);
          const A* __restrict__ wr = wt + r * C;
          for (int64_t q = 0; q < NC; ++q) {
            const V wq = vload(wr + q * W);
            v0s[q] += wq * v0;
            v1s[q] += wq * v1;
          }
        }
        A a0[C], a1[C];
        for (int64_t q = 0; q < NC; ++q) { vstore(a0 + q * W, v0s[q]); vstore(a1 + q * W, v1s[q]); }
        T* __restrict__ y0 = out + (o0 + j) * (C + 1);
        T* __restrict__ y1 = y0 + (C + 1);
        for (int64_t c = 0; c < C; ++c) y0[c] = static_cast<T>(elu(a0[c]));
        for (int64_t c = 0; c < C; ++c) y1[c] = static_cast<T>(elu(a1[c]));
        y0[C] = ld[o0 + j];
        y1[C] = ld[o0 + j + 1];
      }
      for (; j < Lo; ++j) {
        A a[C];
        conv_window<T, A>(h + (n0 + j) * H, wt, b2, KH, C, a, out + (o0 + j) * (C + 1), ld[o0 + j]);
      }
    }
  });
}

template <typename T, int64_t H, int64_t C>
void backward_kernel_fixed(const Dims& d, const T* go, const T* x, const int64_t* off, const T* h, const T* y,
                           const T* w1, const T* w2, T* gx, T* gw1, T* gb1, T* gw2, T* gb2) {
  using A = at::opmath_type<T>;  // float for float16 / bfloat16 storage
  using V = typename VecOf<A>::type;
  constexpr int64_t W = VecOf<A>::width, NC = C / W, NH = H / W;
  static_assert(C % W == 0 && H % W == 0, "fixed kernels need C and H multiples of the vector width");
  const int64_t F = d.F, k = d.k, km1 = k - 1, KH = k * H;
  // Partials layout per chunk: [dW2 as [t][i][c] | db2 [C] | dW1 as [f][i] | db1 [H]].
  const int64_t P_W2 = 0, P_B2 = KH * C, P_W1 = P_B2 + C, P_B1 = P_W1 + H * F, P = P_B1 + H;
  std::vector<A> w2g(k * C * H);  // [t][c][i]
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t t = 0; t < k; ++t) w2g[(t * C + c) * H + i] = w2[(c * H + i) * k + t];
  std::vector<A> w1t(F * H);  // [f][i]
  for (int64_t i = 0; i < H; ++i)
    for (int64_t f = 0; f < F; ++f) w1t[f * H + i] = w1[i * F + f];
  const int64_t n_chunks = (d.B + kTripsPerChunk - 1) / kTripsPerChunk;
  std::vector<A> partials(n_chunks * P, A(0));
  // The projection gradients sum over every point of a chunk (hundreds of terms): accumulate them in
  // double so float32 stays within the flash-attention rule against the reference's blocked sums.
  const int64_t PD = P - P_W1;
  std::vector<double> partials_d(n_chunks * PD, 0.0);
  at::parallel_for(0, n_chunks, 1, [&](int64_t ch0, int64_t ch1) {
    std::vector<A> gzv;
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      A* __restrict__ part = partials.data() + ch * P;
      double* __restrict__ part_d = partials_d.data() + ch * PD - P_W1;  // indexed like part
      for (int64_t b = ch * kTripsPerChunk; b < std::min(d.B, (ch + 1) * kTripsPerChunk); ++b) {
        const int64_t n0 = off[b], L = off[b + 1] - n0, Lo = L - km1, o0 = out_start(off, b, km1);
        gzv.resize(Lo * C);
        A* __restrict__ gz = gzv.data();
        // dz = dy * elu'(z); conv bias gradient summed over windows in order.
        {
          A pb[C];
          for (int64_t c = 0; c < C; ++c) pb[c] = part[P_B2 + c];
          for (int64_t j = 0; j < Lo; ++j) {
            const T* __restrict__ g = go + (o0 + j) * (C + 1);
            const T* __restrict__ yy = y + (o0 + j) * (C + 1);
            A* __restrict__ z = gz + j * C;
            for (int64_t c = 0; c < C; ++c) {
              z[c] = static_cast<A>(g[c]) * elu_grad_from_output(static_cast<A>(yy[c]));
              pb[c] += z[c];
            }
          }
          for (int64_t c = 0; c < C; ++c) part[P_B2 + c] = pb[c];
        }
        // Conv weight gradient: row r of [t][i][c] accumulates h[n0 + j, r] * dz[j, :] over j in order;
        // two rows at a time stay in registers over all windows of the trip.
        const T* __restrict__ hb = h + n0 * H;
        int64_t r = 0;
        for (; r + 2 <= KH; r += 2) {
          A* __restrict__ pw0 = part + P_W2 + r * C;
          A* __restrict__ pw1 = pw0 + C;
          V s0[NC], s1[NC];
          for (int64_t q = 0; q < NC; ++q) { s0[q] = vload(pw0 + q * W); s1[q] = vload(pw1 + q * W); }
          for (int64_t j = 0; j < Lo; ++j) {
            const A v0 = static_cast<A>(hb[j * H + r]), v1 = static_cast<A>(hb[j * H + r + 1]);
            const A* __restrict__ z = gz + j * C;
            for (int64_t q = 0; q < NC; ++q) {
              const V zq = vload(z + q * W);
              s0[q] += v0 * zq;
              s1[q] += v1 * zq;
            }
          }
          for (int64_t q = 0; q < NC; ++q) { vstore(pw0 + q * W, s0[q]); vstore(pw1 + q * W, s1[q]); }
        }
        for (; r < KH; ++r) {
          A* __restrict__ pw = part + P_W2 + r * C;
          V s[NC];
          for (int64_t q = 0; q < NC; ++q) s[q] = vload(pw + q * W);
          for (int64_t j = 0; j < Lo; ++j) {
            const A v = static_cast<A>(hb[j * H + r]);
            const A* __restrict__ z = gz + j * C;
            for (int64_t q = 0; q < NC; ++q) s[q] += v * vload(z + q * W);
          }
          for (int64_t q = 0; q < NC; ++q) vstore(pw + q * W, s[q]);
        }
        // Points: dh from the (up to k) windows containing the point, then tanh and the projection.
        for (int64_t p = 0; p < L; ++p) {
          V ghv[NH];
          for (int64_t q = 0; q < NH; ++q) ghv[q] = V{};
          for (int64_t t = 0; t < k; ++t) {
            const int64_t j = p - t;
            if (j < 0 || j >= Lo) continue;
            const A* __restrict__ z = gz + j * C;
            const A* __restrict__ wgt = w2g.data() + t * C * H;
            for (int64_t c = 0; c < C; ++c) {
              const A zc = z[c];
              for (int64_t q = 0; q < NH; ++q) ghv[q] += vload(wgt + c * H + q * W) * zc;
            }
          }
          A ghp[H];
          for (int64_t q = 0; q < NH; ++q) vstore(ghp + q * W, ghv[q]);
          const T* __restrict__ hp = h + (n0 + p) * H;
          const T* __restrict__ xp = x + (n0 + p) * F;
          A gu[H];
          for (int64_t i = 0; i < H; ++i) gu[i] = ghp[i] * tanh_grad_from_output(static_cast<A>(hp[i]));
          for (int64_t f = 0; f < F; ++f) {
            const A* __restrict__ w1f = w1t.data() + f * H;
            A s = A(0);
            for (int64_t i = 0; i < H; ++i) s += gu[i] * w1f[i];
            gx[(n0 + p) * F + f] = static_cast<T>(s);
          }
          for (int64_t i = 0; i < H; ++i) part_d[P_B1 + i] += static_cast<double>(gu[i]);
          for (int64_t f = 0; f < F; ++f) {  // dW1 partial kept as [f][i]: contiguous over i
            const double xf = static_cast<double>(xp[f]);
            double* __restrict__ pw = part_d + P_W1 + f * H;
            for (int64_t i = 0; i < H; ++i) pw[i] += static_cast<double>(gu[i]) * xf;
          }
        }
      }
    }
  });
  at::parallel_for(0, P, 256, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      double s = 0.0;
      if (q < P_W1) {
        A sa = A(0);
        for (int64_t ch = 0; ch < n_chunks; ++ch) sa += partials[ch * P + q];
        s = static_cast<double>(sa);
      } else {
        for (int64_t ch = 0; ch < n_chunks; ++ch) s += partials_d[ch * PD + q - P_W1];
      }
      if (q < P_B2) {
        const int64_t rr = q / C, c = q % C, t = rr / H, i = rr % H;
        gw2[(c * H + i) * k + t] = static_cast<T>(s);
      } else if (q < P_W1) {
        gb2[q - P_B2] = static_cast<T>(s);
      } else if (q < P_B1) {
        const int64_t f = (q - P_W1) / H, i = (q - P_W1) % H;
        gw1[i * F + f] = static_cast<T>(s);
      } else {
        gb1[q - P_B1] = static_cast<T>(s);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> geo_conv_forward_cpu(const at::Tensor& points, const at::Tensor& offsets,
                                                         const at::Tensor& local_dist, const at::Tensor& proj_weight,
                                                         const at::Tensor& proj_bias, const at::Tensor& conv_weight,
                                                         const at::Tensor& conv_bias) {
  // Every argument, offsets' values included, is checked here (geo_conv_checks.h, shared with CUDA).
  const Dims d = check_forward_args(points, offsets, local_dist, proj_weight, proj_bias, conv_weight, conv_bias);
  auto x = points.contiguous();
  auto off = offsets.contiguous();
  auto ld = local_dist.contiguous(), w1 = proj_weight.contiguous(), b1 = proj_bias.contiguous();
  auto w2 = conv_weight.contiguous(), b2 = conv_bias.contiguous();
  auto out = at::empty({d.N_out, d.C + 1}, x.options());
  auto h = at::empty({d.N, d.H}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "geo_conv_forward_cpu", [&] {
    auto* kern = (d.H == 16 && d.C == 32) ? &forward_kernel_fixed<scalar_t, 16, 32> : &forward_kernel<scalar_t>;
    kern(d, x.data_ptr<scalar_t>(), off.data_ptr<int64_t>(), ld.data_ptr<scalar_t>(),
         w1.data_ptr<scalar_t>(), b1.data_ptr<scalar_t>(), w2.data_ptr<scalar_t>(),
         b2.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), h.data_ptr<scalar_t>());
  });
  return {out, h};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geo_conv_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& hidden,
    const at::Tensor& out, const at::Tensor& proj_weight, const at::Tensor& conv_weight) {
  const Dims d = check_backward_args(grad_out, points, offsets, hidden, out, proj_weight, conv_weight);
  auto x = points.contiguous(), off = offsets.contiguous(), h = hidden.contiguous(), y = out.contiguous();
  auto go = grad_out.contiguous(), w1 = proj_weight.contiguous(), w2 = conv_weight.contiguous();
  auto gx = at::empty_like(x), gw1 = at::empty_like(w1), gb1 = at::empty({d.H}, w1.options());
  auto gw2 = at::empty_like(w2), gb2 = at::empty({d.C}, w2.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "geo_conv_backward_cpu", [&] {
    auto* kern = (d.H == 16 && d.C == 32) ? &backward_kernel_fixed<scalar_t, 16, 32> : &backward_kernel<scalar_t>;
    kern(d, go.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), off.data_ptr<int64_t>(),
         h.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), w1.data_ptr<scalar_t>(),
         w2.data_ptr<scalar_t>(), gx.data_ptr<scalar_t>(), gw1.data_ptr<scalar_t>(),
         gb1.data_ptr<scalar_t>(), gw2.data_ptr<scalar_t>(), gb2.data_ptr<scalar_t>());
  });
  return {gx, gw1, gb1, gw2, gb2};
}

}  // namespace

TORCH_LIBRARY_IMPL(stfast, CPU, m) {
  m.impl("geo_conv_forward", &geo_conv_forward_cpu);
  m.impl("geo_conv_backward", &geo_conv_backward_cpu);
}

}  // namespace geo_conv
}  // namespace stfast
