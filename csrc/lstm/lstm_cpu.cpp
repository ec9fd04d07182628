// CPU kernels of stfast::lstm_forward / stfast::lstm_backward (schemas in csrc/ops.cpp): the fused
// pointwise step over the alive rows. The layer and time loops and the GEMMs are in lstm_driver.h,
// the per-element math in lstm.h (shared with CUDA).
//
// Each row's inner loop runs over the H contiguous elements of the four gate blocks; with -ffast-math
// and -march=native (CMakeLists.txt) gcc vectorizes it, tanh through glibc's libmvec. Rows are split
// over threads only when a step has enough of them to pay for the fork (at::parallel_for's grain).
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include "../common/cpu_workspace.h"
#include "../common/gemm.h"
#include "../common/ukernel.h"
#include "lstm.h"
#include "lstm_driver.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace stfast {
namespace lstm {
namespace {

constexpr int64_t kElementsPerTask = 16384;  // ~ 5 tanh per element: below this a fork costs more than it saves
constexpr int64_t kSmallRows = 8;

// out[r, :] += Σ_k dG[r, k] W[k, :] for a few float32 rows, accumulated in double, 32 columns at a time in
// registers. Why: below 8 rows (the trips still alive at the end of long ones) MKL's sgemm sums the depth
// 4H sequentially (with 2 threads from 5 rows up), in place too, which made float32 h0/c0 gradients 3-4x
// less accurate than torch.nn.LSTM's (measured); at::mm in double there costs ~4x, this ~1x.
void add_rows_double_acc(float* __restrict__ out, int64_t out_stride, const float* __restrict__ dG, int64_t K,
                         const float* __restrict__ w, int64_t N, int64_t rows) {
  constexpr int64_t J = 32;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ g = dG + r * K;
    float* __restrict__ o = out + r * out_stride;
    int64_t j0 = 0;
    for (; j0 + J <= N; j0 += J) {
      double acc[J] = {};
      for (int64_t k = 0; k < K; ++k) {
        const double gk = g[k];
        const float* __restrict__ wk = w + k * N + j0;
        _Pragma("omp simd")
        for (int64_t j = 0; j < J; ++j) acc[j] += gk * static_cast<double>(wk[j]);
      }
      for (int64_t j = 0; j < J; ++j) o[j0 + j] = static_cast<float>(static_cast<double>(o[j0 + j]) + acc[j]);
    }
    for (int64_t j = j0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(g[k]) * static_cast<double>(w[k * N + j]);
      o[j] = static_cast<float>(static_cast<double>(o[j]) + acc);
    }
  }
}

// 16-bit <-> float conversion of n contiguous values, written on the bits so that gcc vectorizes it (c10's
// element conversions do not vectorize, which made the bfloat16 pointwise steps scalar: 4x slower than float32).
// Rounding to nearest even, NaN kept a (quiet) NaN, as c10::BFloat16.
template <typename S, typename A>
inline void widen(const S* __restrict__ in, A* __restrict__ out, int64_t n) {
  if constexpr (std::is_same_v<S, c10::BFloat16> && std::is_same_v<A, float>) {
    const uint16_t* __restrict__ u = reinterpret_cast<const uint16_t*>(in);
    _Pragma("omp simd")
    for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(u[i]) << 16);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<A>(in[i]);
  }
}

template <typename A, typename S>
inline void narrow_to(const A* __restrict__ in, S* __restrict__ out, int64_t n) {
  if constexpr (std::is_same_v<S, c10::BFloat16> && std::is_same_v<A, float>) {
    uint16_t* __restrict__ u = reinterpret_cast<uint16_t*>(out);
    _Pragma("omp simd")
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t b = std::bit_cast<uint32_t>(in[i]);
      const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
      u[i] = static_cast<uint16_t>(nan ? (b >> 16) | 0x40u : (b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<S>(in[i]);
  }
}

// Per-thread float rows for the 16-bit steps (the staged loops below).
template <typename A>
A* row_scratch(int64_t n) {
  thread_local std::vector<A> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// Rows per at::parallel_for task: at least one, ~kElementsPerTask elements (H = 0 is a valid, empty size).
int64_t grain(int64_t H) { return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(H, 1)); }

using std::integral_constant;

struct CpuBackend {
  static constexpr int64_t kGemmRowBlock = 1024;

  static at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& opt) {
    return empty_cpu_workspace(sizes, opt.dtype().toScalarType());
  }

  // lstm_driver.h's split of the time loops: one part per intra-op thread; none inside a parallel region
  // (a caller's at::parallel_for), where everything runs on the calling thread anyway.
  static int64_t step_threads() { return at::in_parallel_region() ? 1 : at::get_num_threads(); }

  // f(0) .. f(parts − 1), one per thread. Inside, at::parallel_for (the pointwise steps) runs inline and the
  // GEMM libraries see a parallel region: each product runs on its caller's thread alone.
  template <class F>
  static void parallel_parts(int64_t parts, const F& f) {
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) f(i);
    });
  }

  // The library chosen per dtype at run time (csrc/common/gemm.h: MKL, oneDNN or the micro-kernel, by a probe).
  static void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
    gemm::mm(out, a, b, accumulate);
  }

  // A weight the time loop reuses, packed once for the micro-kernel where that is the chosen library.
  static gemm::Weight prepare(const at::Tensor& w, at::ScalarType out) { return gemm::prepare(w, out); }

  static void mm(const at::Tensor& out, const at::Tensor& a, const gemm::Weight& w, bool accumulate) {
    gemm::mm(out, a, w, accumulate);
  }

  // out (rows, H) += dG (rows, 4H) · W_hh (4H, H) (prepared once per layer); out may be a row range of a larger
  // tensor.
  static void add_recurrent_grad(at::Tensor out, const at::Tensor& dG, const gemm::Weight& w_hh) {
    const at::Tensor& w = w_hh.b;
    if (out.scalar_type() == at::kFloat && dG.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
        out.size(0) < kSmallRows && dG.is_contiguous() && w.is_contiguous() && out.stride(1) == 1) {
      add_rows_double_acc(out.data_ptr<float>(), out.stride(0), dG.const_data_ptr<float>(), dG.size(1),
                          w.const_data_ptr<float>(), w.size(1), out.size(0));
    } else {
      mm(out, dG, w_hh, /*accumulate=*/true);
    }
  }

  // Units per gate in one tile of the fused step (a multiple of kBlockN / 4 = 16): the pointwise loop runs over
  // this many contiguous floats per gate. Measured (AMD EPYC Zen 3, AVX2, float32, H 128, B 64, 1 thread): the
  // forward's steps 182 ms per 20 calls at 64 units, 204 at 16, against 196 for the unfused step on MKL.
  static constexpr int64_t kUnit = 64;

  // The forward's W_hhᵀ (H, 4H) for fused_forward_step: packed with the four gates interleaved per block of
  // units where the micro-kernel is the step library (csrc/common/gemm.h); else as prepare() (fuses() false).
  static gemm::Weight prepare_fused(const at::Tensor& w_t, at::ScalarType out) {
    return gemm::prepare(w_t, out, 4, kUnit);
  }
  static bool fuses(const gemm::Weight& w) { return w.groups == 4; }

  // One step's recurrent product and cell in one pass, tile by tile: the pre-activation tile h_prev · W_hhᵀ of
  // kTileM rows × the four gates of w.unit units lands in a float tile, and the cell is applied while it is hot
  // (+ pre, the projection x·W_ihᵀ in A, + bias), writing gates, c and h. Why: the unfused step writes the
  // (bs, 4H) product to memory and reads it back in the pointwise pass; this keeps it in L1, and one fork serves
  // both. Same arithmetic as forward_step (the tile is float32: A == float).
  template <typename T, typename A>
  static void fused_forward_step(const gemm::Weight& w, const T* h_prev, int64_t ld_h, T* gates, const A* pre,
                                 const A* bias, const A* c_prev, A* c, T* h, int64_t bs, int64_t H) {
    if constexpr (!std::is_same_v<A, float>) {
      TORCH_CHECK(false, "stfast.lstm: the fused step runs float32 accumulation only");
    } else {
      // not an ATen call: named for the profiler (benchmarks/step_profile.py counts it with the GEMMs)
      RECORD_FUNCTION("stfast::lstm_fused_step", std::vector<c10::IValue>());
      using gemm::brgemm::kTileM;
      const int64_t unit = w.unit;
      TORCH_CHECK(unit > 0 && unit <= kUnit, "stfast.lstm: fused step unit ", unit);
      const int64_t row_tiles = (bs + kTileM - 1) / kTileM, unit_blocks = (H + unit - 1) / unit;
      auto run = [&](auto has_c_prev) {
        // a task: ≥ ~1 M multiply-adds, below which a fork costs more than it saves
        const int64_t grain = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(1, kTileM * 4 * unit * H));
        at::parallel_for(0, row_tiles * unit_blocks, grain, [&](int64_t t0, int64_t t1) {
          const gemm::ukernel::TileScope tiles(w.packed.vnni());  // 16-bit: this thread's run, closed on any exit
          alignas(64) float tile[kTileM * 4 * kUnit];
          alignas(64) float act[5 * kUnit];  // 16-bit storage: activations and h of one row, then rounded
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t r0 = (t / unit_blocks) * kTileM, blk = t % unit_blocks, j0 = blk * unit;
            const int64_t m = std::min(kTileM, bs - r0), nb = std::min(unit, H - j0), ldt = 4 * nb;
            w.packed.mm(tile, ldt, h_prev + r0 * ld_h, ld_h, m, /*add_C=*/false, 4 * j0, 4 * j0 + ldt);
            for (int64_t r = r0; r < r0 + m; ++r) {
              const float* __restrict__ tr = tile + (r - r0) * ldt;
              const A* pr = pre + r * 4 * H + j0;
              const A* __restrict__ br = bias + j0;
              T* gr = gates + r * 4 * H + j0;
              A* __restrict__ cr = c + r * H + j0;
              const A* __restrict__ cp = decltype(has_c_prev)::value ? c_prev + r * H + j0 : nullptr;
              A* __restrict__ ga = std::is_same_v<T, A> ? reinterpret_cast<A*>(gr) : act;  // activations
              A* __restrict__ hr = std::is_same_v<T, A> ? reinterpret_cast<A*>(h + r * H + j0) : act + 4 * unit;
              const int64_t ld_act = std::is_same_v<T, A> ? H : unit;
              _Pragma("omp simd")
              for (int64_t j = 0; j < nb; ++j) {
                A a[4];
                for (int u = 0; u < 4; ++u) a[u] = tr[u * nb + j] + pr[u * H + j] + br[u * H + j];
                A cc, hh;
                cell_forward(a[0], a[1], a[2], a[3], decltype(has_c_prev)::value ? cp[j] : A(0), cc, hh);
                cr[j] = cc;
                for (int u = 0; u < 4; ++u) ga[u * ld_act + j] = a[u];
                hr[j] = hh;
              }
              if constexpr (!std::is_same_v<T, A>) {
                for (int u = 0; u < 4; ++u) narrow_to(act + u * unit, gr + u * H, nb);
                narrow_to(act + 4 * unit, h + r * H + j0, nb);
              }
            }
          }
        });
      };
      if (c_prev != nullptr) run(integral_constant<bool, true>{});
      else run(integral_constant<bool, false>{});
    }
  }

  // gates may alias pre (P == T: the activations overwrite the pre-activations in place), so neither is
  // __restrict__; `omp simd` vectorizes the element loop regardless. The four variants (initial cell or
  // not, recurrent product or not) are compiled separately so the inner loop has no branch.
  template <typename T, typename A, typename P>
  // h_wide (16-bit storage, optional): h as stored (rounded to T) also written widened to A, the next step's
  // operand of a product that runs in A (widens(w)), so no step copies h to widen it.
  static void forward_step(T* gates, const P* pre, const A* rec, const A* bias, const A* c_prev, A* c, T* h,
                           int64_t bs, int64_t H, A* h_wide = nullptr) {
    auto run = [&](auto has_c_prev, auto has_rec) {
      at::parallel_for(0, bs, grain(H), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          T* g = gates + r * 4 * H;
          const P* pa = pre + r * 4 * H;
          const A* __restrict__ ra = has_rec ? rec + r * 4 * H : nullptr;
          const A* __restrict__ cp = has_c_prev ? c_prev + r * H : nullptr;
          A* __restrict__ cr = c + r * H;
          T* __restrict__ hr = h + r * H;
          // The float loop, from `src` (4H pre-activations) to `act` (4H activations, may alias src) and `hf`.
          auto cell = [&](const A* src, A* act, A* __restrict__ hf) {
            _Pragma("omp simd")
            for (int64_t j = 0; j < H; ++j) {
              A a[4];
              for (int u = 0; u < 4; ++u) {
                a[u] = src[u * H + j];
                if constexpr (decltype(has_rec)::value) a[u] += ra[u * H + j];
                a[u] += bias[u * H + j];
              }
              A cc, hh;
              cell_forward(a[0], a[1], a[2], a[3], decltype(has_c_prev)::value ? cp[j] : A(0), cc, hh);
              for (int u = 0; u < 4; ++u) act[u * H + j] = a[u];
              cr[j] = cc;
              hf[j] = hh;
            }
          };
          if constexpr (std::is_same_v<T, A> && std::is_same_v<P, A>) {
            cell(pa, g, hr);
          } else {  // 16-bit storage: the row widened into float scratch, the same loop, rounded back
            A* __restrict__ sa = row_scratch<A>(5 * H);
            widen(pa, sa, 4 * H);
            cell(sa, sa, sa + 4 * H);
            narrow_to(sa, g, 4 * H);
            narrow_to(sa + 4 * H, hr, H);
            if (h_wide != nullptr) widen(hr, h_wide + r * H, H);
          }
        }
      });
    };
    using Yes = integral_constant<bool, true>;
    using No = integral_constant<bool, false>;
    if (c_prev != nullptr) {
      if (rec != nullptr) run(Yes{}, Yes{});
      else run(Yes{}, No{});
    } else {
      if (rec != nullptr) run(No{}, Yes{});
      else run(No{}, No{});
    }
  }

  // The backward pointwise step of rows [0, m) (gates, c, c_prev, dh, dc, dgates point at the first row): dG from
  // the saved gates and cell, dc carried to the previous step. 16-bit storage: gates widened into float scratch,
  // the gradients rounded back once.
  template <typename T, typename A, bool kHasCPrev>
  static void backward_rows(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, int64_t m,
                            int64_t H, A* dg_wide = nullptr) {
    for (int64_t r = 0; r < m; ++r) {
      const T* __restrict__ gi = gates + r * 4 * H;
      const A* __restrict__ cr = c + r * H;
      const A* __restrict__ cp = kHasCPrev ? c_prev + r * H : nullptr;
      const A* __restrict__ dhr = dh + r * H;
      A* __restrict__ dcr = dc + r * H;
      T* __restrict__ di = dgates + r * 4 * H;
      A* __restrict__ sg = std::is_same_v<T, A> ? nullptr : row_scratch<A>(8 * H);
      A* __restrict__ sd = std::is_same_v<T, A> ? nullptr : sg + 4 * H;
      const A* __restrict__ ga;
      A* __restrict__ da;
      if constexpr (std::is_same_v<T, A>) {
        ga = gi;
        da = di;
      } else {
        widen(gi, sg, 4 * H);
        ga = sg;
        da = sd;
      }
      _Pragma("omp simd")
      for (int64_t j = 0; j < H; ++j) {
        A dcc = dcr[j], a_i, a_f, a_g, a_o;
        cell_backward<A>(ga[j], ga[H + j], ga[2 * H + j], ga[3 * H + j], cr[j], kHasCPrev ? cp[j] : A(0), dhr[j], dcc,
                         a_i, a_f, a_g, a_o);
        dcr[j] = dcc;
        da[j] = a_i;
        da[H + j] = a_f;
        da[2 * H + j] = a_g;
        da[3 * H + j] = a_o;
      }
      if constexpr (!std::is_same_v<T, A>) {
        narrow_to(sd, di, 4 * H);
        if (dg_wide != nullptr) widen(di, dg_wide + r * 4 * H, 4 * H);
      }
    }
  }

  // dg_wide (16-bit storage, optional): dG as stored also written widened to A, for a recurrent product in A.
  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H, A* dg_wide = nullptr) {
    auto run = [&](auto has_c_prev) {
      at::parallel_for(0, bs, grain(H), [&](int64_t r0, int64_t r1) {
        backward_rows<T, A, decltype(has_c_prev)::value>(
            gates + r0 * 4 * H, c + r0 * H, c_prev == nullptr ? nullptr : c_prev + r0 * H, dh + r0 * H, dc + r0 * H,
            dgates + r0 * 4 * H, r1 - r0, H, dg_wide == nullptr ? nullptr : dg_wide + r0 * 4 * H);
      });
    };
    if (c_prev != nullptr) run(integral_constant<bool, true>{});
    else run(integral_constant<bool, false>{});
  }

  // The bias gradient: column sums (4H,) in A of a (N, 4H) 16-bit dG as stored. Why not at::sum(dG, 0, A): it
  // widens the whole dG into a new float tensor first (bfloat16 on the Zen 3 EPYC: 3.6 ms of a 120 ms training
  // step, the largest copy of a bf16-mixed step). Blocks of 64 rows summed in float, blocks in double; columns
  // split over threads (each column's order fixed: deterministic).
  static at::Tensor column_sums(const at::Tensor& dG, at::ScalarType acc) {
    if (dG.scalar_type() != at::kBFloat16 || acc != at::kFloat || !dG.is_contiguous()) {
      return at::sum(dG, {0}, false, acc);
    }
    constexpr int64_t kRows = 64, kCols = 256;
    const int64_t N = dG.size(0), C = dG.size(1);
    at::Tensor out = at::empty({C}, dG.options().dtype(at::kFloat));
    const c10::BFloat16* src = dG.const_data_ptr<c10::BFloat16>();
    float* dst = out.data_ptr<float>();
    at::parallel_for(0, (C + kCols - 1) / kCols, 1, [&](int64_t b0, int64_t b1) {
      alignas(64) float row[kCols], block[kCols];
      double total[kCols];
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t j0 = b * kCols, nc = std::min(kCols, C - j0);
        std::fill(total, total + nc, 0.0);
        for (int64_t r0 = 0; r0 < N; r0 += kRows) {
          std::fill(block, block + nc, 0.0f);
          for (int64_t r = r0; r < std::min(N, r0 + kRows); ++r) {
            widen(src + r * C + j0, row, nc);
            _Pragma("omp simd")
            for (int64_t j = 0; j < nc; ++j) block[j] += row[j];
          }
          for (int64_t j = 0; j < nc; ++j) total[j] += block[j];
        }
        for (int64_t j = 0; j < nc; ++j) dst[j0 + j] = static_cast<float>(total[j]);
      }
    });
    return out;
  }

  // Whether products of T operands with a prepared weight w run in A on widened operands (ATen with the weight
  // widened once: csrc/common/gemm_cpu.cpp, widened_once): then the driver hands them the A copies that the
  // pointwise steps write beside h and dG (h_wide, dg_wide) instead of T rows to widen in every step.
  template <typename T>
  static bool widens(const gemm::Weight& w) {
    return !std::is_same_v<T, float> && !w.packed.defined() && w.lib != gemm::kOneDnn &&
           w.b.scalar_type() == at::kFloat;
  }

  // Whether a prepared W_hh (4H, H) runs fused_backward_step: packed for the micro-kernel in the gradient's dtype.
  template <typename T>
  static bool fuses_backward(const gemm::Weight& w_hh) {
    return w_hh.packed.defined() && w_hh.packed.dtype() == c10::CppTypeToScalarType<T>::value;
  }

  // One backward step's pointwise gradients and their recurrent product in one pass, tile by tile: for kTileM rows,
  // dG (written to dgates, T) and then dh_prev (A, the previous step's rows) += dG · W_hh while that dG tile is in
  // L1. Why: the unfused step writes the (bs, 4H) dG and reads it back in a second pass with a second fork (issue 60:
  // the pointwise work around the products was 37-50 % of a training step). Same arithmetic as backward_step +
  // add_recurrent_grad (fewer than kSmallRows float32 rows: float64 sums there too).
  template <typename T, typename A>
  static void fused_backward_step(const gemm::Weight& w_hh, const T* gates, const A* c, const A* c_prev, const A* dh,
                                  A* dc, T* dgates, A* dh_prev, int64_t bs, int64_t H) {
    if constexpr (!std::is_same_v<A, float>) {
      TORCH_CHECK(false, "stfast.lstm: the fused backward step runs float32 accumulation only");
    } else {
      RECORD_FUNCTION("stfast::lstm_fused_backward_step", std::vector<c10::IValue>());
      using gemm::brgemm::kTileM;
      const bool small = std::is_same_v<T, float> && bs < kSmallRows && w_hh.b.is_contiguous();
      const int64_t row_tiles = (bs + kTileM - 1) / kTileM;
      auto run = [&](auto has_c_prev) {
        at::parallel_for(0, row_tiles, 1, [&](int64_t t0, int64_t t1) {
          const gemm::ukernel::TileScope tiles(w_hh.packed.vnni());
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t r0 = t * kTileM, m = std::min(kTileM, bs - r0);
            backward_rows<T, A, decltype(has_c_prev)::value>(gates + r0 * 4 * H, c + r0 * H,
                                                             c_prev == nullptr ? nullptr : c_prev + r0 * H, dh + r0 * H,
                                                             dc + r0 * H, dgates + r0 * 4 * H, m, H);
            if constexpr (std::is_same_v<T, float>) {
              if (small) {
                add_rows_double_acc(dh_prev + r0 * H, H, dgates + r0 * 4 * H, 4 * H, w_hh.b.const_data_ptr<float>(),
                                    H, m);
                continue;
              }
            }
            w_hh.packed.mm(dh_prev + r0 * H, H, dgates + r0 * 4 * H, 4 * H, m, /*add_C=*/true, 0, H);
          }
        });
      };
      if (c_prev != nullptr) run(integral_constant<bool, true>{});
      else run(integral_constant<bool, false>{});
    }
  }
};

}  // namespace

// How the CPU kernels split a batch's time loops over `threads` threads (lstm_driver.h's split_ranks): the
// rank bounds, 0 = b_0 < b_1 < ... < b_P = B, of ranges of sequences sorted by decreasing length (ties by
// index), each run through all its steps by one thread. For tests and for users sizing batches.
std::vector<int64_t> time_split(const at::Tensor& lengths, int64_t threads) {
  TORCH_CHECK_VALUE(threads >= 1, "stfast.lstm_time_split: threads must be >= 1, got ", threads);
  // The op's own checks of lengths, on a shape-only padded input (B, T, 0) and weights of H 0.
  const int64_t T = lengths.numel() ? std::max<int64_t>(lengths.max().item<int64_t>(), 0) : 0;
  const Dims d = check_args(at::empty({lengths.numel(), T, 0}), lengths, {at::empty({0, 0}), at::empty({0, 0})},
                            std::nullopt, std::nullopt, 1, kPaddedBatchFirst);
  return split_ranks(make_plan(d, lengths, at::kCPU), d.B, threads);
}

TORCH_LIBRARY_FRAGMENT(stfast, m) { m.def("lstm_time_split(Tensor lengths, int threads) -> int[]", &time_split); }

// Checks, plan and dtype dispatch: lstm_driver.h's run_forward / run_backward, the same code as CUDA's.
// On the CPU each call ends with the micro-kernel seam's check that every thread closed its run of 16-bit
// products (a no-op but for the reference seam, csrc/common/ukernel.h).
template <auto Run>
auto checked(auto&&... args) {
  auto out = Run(args...);
  gemm::ukernel::check_released("stfast.lstm");
  return out;
}

TORCH_LIBRARY_IMPL(stfast, CPU, m) {
  m.impl("lstm_forward", [](const at::Tensor& input, const at::Tensor& lengths, at::TensorList weights,
                            const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0,
                            int64_t num_layers, int64_t layout) {
    return checked<&run_forward<CpuBackend>>(input, lengths, weights, h0, c0, num_layers, layout);
  });
  m.impl("lstm_backward", [](const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h_n,
                             const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                             const at::Tensor& lengths, at::TensorList weights, const std::optional<at::Tensor>& h0,
                             const std::optional<at::Tensor>& c0, const at::Tensor& gates, const at::Tensor& cells,
                             const at::Tensor& hiddens, int64_t num_layers, int64_t layout, bool input_grad) {
    return checked<&run_backward<CpuBackend>>(grad_output, grad_h_n, grad_c_n, input, lengths, weights, h0, c0, gates,
                                              cells, hiddens, num_layers, layout, input_grad);
  });
}

}  // namespace lstm
}  // namespace stfast
