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

#include "lstm.h"
#include "lstm_driver.h"

namespace stfast {
namespace lstm {
namespace {

constexpr int64_t kElementsPerTask = 16384;  // ~ 5 tanh per element: below this a fork costs more than it saves

struct CpuBackend {
  template <typename T, typename A>
  static void forward_step(T* gates, const A* c_prev, A* c, T* h, int64_t bs, int64_t H) {
    at::parallel_for(0, bs, std::max<int64_t>(1, kElementsPerTask / H), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        T* __restrict__ gi = gates + r * 4 * H;
        T* __restrict__ gf = gi + H;
        T* __restrict__ gg = gi + 2 * H;
        T* __restrict__ go = gi + 3 * H;
        A* __restrict__ cr = c + r * H;
        T* __restrict__ hr = h + r * H;
        if (c_prev != nullptr) {
          const A* __restrict__ cp = c_prev + r * H;
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A i = gi[j], f = gf[j], g = gg[j], o = go[j], cc, hh;
            cell_forward(i, f, g, o, cp[j], cc, hh);
            gi[j] = i; gf[j] = f; gg[j] = g; go[j] = o; cr[j] = cc; hr[j] = hh;
          }
        } else {
          _Pragma("omp simd")
          for (int64_t j = 0; j < H; ++j) {
            A i = gi[j], f = gf[j], g = gg[j], o = go[j], cc, hh;
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
    int64_t layout) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  check_cpu_dtype(input);
  check_saved(d, input, grad_output, grad_h_n, grad_c_n, gates, cells, hiddens);
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "lstm_backward_cpu", [&] {
    out = backward<scalar_t, scalar_t, CpuBackend>(d, p, grad_output, grad_h_n, grad_c_n, input, weights, h0, c0,
                                                   gates, cells, hiddens);
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
