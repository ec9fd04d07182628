// CUDA backend of stfast::lstm_forward / stfast::lstm_backward (schemas in csrc/ops.cpp): the fused
// pointwise step, one thread per (alive row, hidden unit), whose kernels and launches are lstm_kernels.h
// (also run by the CUDA emulator in every CPU build, csrc/emu/). The layer and time loops live in
// lstm_driver.h and issue the GEMMs through ATen (cuBLAS on the current stream, float accumulation for
// half/bfloat16); the per-element math is lstm.h, shared with the CPU kernel. Buffers come from the
// caching allocator; the only host->device transfer is the step plan's index arrays, copied
// asynchronously from pinned memory, so nothing waits on the device. Weight and bias gradients are
// GEMMs and a column sum over all positions (deterministic, no atomics). Half/bfloat16: gates (the
// activations), hidden states and dG are stored in the input dtype; the pre-activations, the cell state,
// dH and dc in float32, every GEMM with float output (lstm_driver.h, "Precision").
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <limits>

#include "../common/cuda_launcher.cuh"
#include "lstm_driver.h"
#include "lstm_kernels.h"

namespace stfast {
namespace lstm {
namespace {

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
    CudaLauncher L;
    kernels::launch_forward_step<T, A>(L, gates, pre, rec, bias, c_prev, c, h, bs, H);
  }

  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H) {
    CudaLauncher L;
    kernels::launch_backward_step<T, A>(L, gates, c, c_prev, dh, dc, dgates, bs, H);
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
