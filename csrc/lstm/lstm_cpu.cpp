// CPU kernels of stfast::lstm_forward / stfast::lstm_backward (schemas in csrc/ops.cpp): the fused
// pointwise step over the alive rows. The layer and time loops and the GEMMs are in lstm_driver.h,
// the per-element math in lstm.h (shared with CUDA).
//
// Each row's inner loop runs over the H contiguous elements of the four gate blocks; with -ffast-math
// and -march=native (CMakeLists.txt) gcc vectorizes it, tanh through glibc's libmvec. Rows are split
// over threads only when a step has enough of them to pay for the fork (at::parallel_for's grain).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/cpu_workspace.h"
#include "lstm.h"
#include "lstm_driver.h"

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

struct CpuBackend {
  static constexpr int64_t kGemmRowBlock = 1024;

  static at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& opt) {
    return empty_cpu_workspace(sizes, opt.dtype().toScalarType());
  }

  // out (rows, H) += dG (rows, 4H) · W_hh (4H, H); out may be a row range of a larger tensor.
  static void add_recurrent_grad(at::Tensor out, const at::Tensor& dG, const at::Tensor& w_hh) {
    if (out.scalar_type() == at::kFloat && out.size(0) < kSmallRows && dG.is_contiguous() && w_hh.is_contiguous() &&
        out.stride(1) == 1) {
      add_rows_double_acc(out.data_ptr<float>(), out.stride(0), dG.const_data_ptr<float>(), dG.size(1),
                          w_hh.const_data_ptr<float>(), w_hh.size(1), out.size(0));
    } else {
      out.addmm_(dG, w_hh);
    }
  }

  template <typename T, typename A>
  static void forward_step(T* gates, const T* bias, const A* c_prev, A* c, T* h, int64_t bs, int64_t H) {
    at::parallel_for(0, bs, std::max<int64_t>(1, kElementsPerTask / H), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        T* __restrict__ gi = gates + r * 4 * H;
        T* __restrict__ gf = gi + H;
        T* __restrict__ gg = gi + 2 * H;
        T* __restrict__ go = gi + 3 * H;
        A* __restrict__ cr = c + r * H;
        T* __restrict__ hr = h + r * H;
        const T* __restrict__ bi = bias;
        const T* __restrict__ bf = bias + H;
        const T* __restrict__ bg = bias + 2 * H;
        const T* __restrict__ bo = bias + 3 * H;
        if (c_prev != nullptr) {
          const A* __restrict__ cp = c_prev + r * H;
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A i = gi[j] + bi[j], f = gf[j] + bf[j], g = gg[j] + bg[j], o = go[j] + bo[j], cc, hh;
            cell_forward(i, f, g, o, cp[j], cc, hh);
            gi[j] = i; gf[j] = f; gg[j] = g; go[j] = o; cr[j] = cc; hr[j] = hh;
          }
        } else {
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A i = gi[j] + bi[j], f = gf[j] + bf[j], g = gg[j] + bg[j], o = go[j] + bo[j], cc, hh;
            cell_forward(i, f, g, o, A(0), cc, hh);
            gi[j] = i; gf[j] = f; gg[j] = g; go[j] = o; cr[j] = cc; hr[j] = hh;
          }
        }
      }
    });
  }

  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const T* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H) {
    at::parallel_for(0, bs, std::max<int64_t>(1, kElementsPerTask / H), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* __restrict__ gi = gates + r * 4 * H;
        const A* __restrict__ cr = c + r * H;
        const T* __restrict__ dhr = dh + r * H;
        A* __restrict__ dcr = dc + r * H;
        T* __restrict__ di = dgates + r * 4 * H;
        if (c_prev != nullptr) {
          const A* __restrict__ cp = c_prev + r * H;
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A dcc = dcr[j], a_i, a_f, a_g, a_o;
            cell_backward<A>(gi[j], gi[H + j], gi[2 * H + j], gi[3 * H + j], cr[j], cp[j], dhr[j], dcc, a_i, a_f, a_g,
                             a_o);
            dcr[j] = dcc; di[j] = a_i; di[H + j] = a_f; di[2 * H + j] = a_g; di[3 * H + j] = a_o;
          }
        } else {
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A dcc = dcr[j], a_i, a_f, a_g, a_o;
            cell_backward<A>(gi[j], gi[H + j], gi[2 * H + j], gi[3 * H + j], cr[j], A(0), dhr[j], dcc, a_i, a_f, a_g,
                             a_o);
            dcr[j] = dcc; di[j] = a_i; di[H + j] = a_f; di[2 * H + j] = a_g; di[3 * H + j] = a_o;
          }
        }
      }
    });
  }
};

void check_cpu_dtype(const at::Tensor& input) {
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble,
              "stfast.lstm: the CPU kernels take float32 or float64, got ", input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_forward_cpu(
    const at::Tensor& input, const at::Tensor& lengths, at::TensorList weights, const std::optional<at::Tensor>& h0,
    const std::optional<at::Tensor>& c0, int64_t num_layers, int64_t layout) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  check_cpu_dtype(input);
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "lstm_forward_cpu", [&] {
    out = forward<scalar_t, scalar_t, CpuBackend>(d, p, input, weights, h0, c0);
  });
  return out;
}

std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> lstm_backward_cpu(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input, const at::Tensor& lengths,
    at::TensorList weights, const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& gates, const at::Tensor& cells, const at::Tensor& hiddens, int64_t num_layers,
    int64_t layout, bool input_grad) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  check_cpu_dtype(input);
  check_saved(d, input, grad_output, grad_h_n, grad_c_n, gates, cells, hiddens);
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "lstm_backward_cpu", [&] {
    out = backward<scalar_t, scalar_t, CpuBackend>(d, p, grad_output, grad_h_n, grad_c_n, input, weights, h0, c0,
                                                   gates, cells, hiddens, input_grad);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(stfast, CPU, m) {
  m.impl("lstm_forward", &lstm_forward_cpu);
  m.impl("lstm_backward", &lstm_backward_cpu);
}

}  // namespace lstm
}  // namespace stfast
