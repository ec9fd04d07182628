// stfast_emu::lstm_forward / lstm_backward: lstm_driver.h's checks, plan and loops with the CUDA backend's
// pointwise kernels (lstm_kernels.h) on the emulator, and its GEMMs through ATen on the CPU as one GEMM
// per call, as cuBLAS gets them (kGemmRowBlock).
#include <torch/library.h>

#include "emu_launcher.h"  // first: the kernel headers define the device vocabulary as macros

#include <limits>

#include "../lstm/lstm_driver.h"
#include "../lstm/lstm_kernels.h"

namespace stfast {
namespace emu {
namespace {

struct EmuBackend {
  static constexpr int64_t kGemmRowBlock = std::numeric_limits<int64_t>::max();

  static at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& opt) { return EmuLauncher().empty(sizes, opt); }

  static void mm(at::Tensor out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
    if (out.numel() == 0) return;
    lstm::mm_widened(std::move(out), a, b, accumulate);
  }

  static void add_recurrent_grad(at::Tensor out, const at::Tensor& dG, const at::Tensor& w_hh) {
    mm(std::move(out), dG, w_hh, /*accumulate=*/true);
  }

  template <typename T, typename A>
  static void forward_step(T* gates, const A* pre, const A* rec, const A* bias, const A* c_prev, A* c, T* h,
                           int64_t bs, int64_t H) {
    EmuLauncher L;
    lstm::kernels::launch_forward_step<T, A>(L, gates, pre, rec, bias, c_prev, c, h, bs, H);
  }

  template <typename T, typename A>
  static void backward_step(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, int64_t bs,
                            int64_t H) {
    EmuLauncher L;
    lstm::kernels::launch_backward_step<T, A>(L, gates, c, c_prev, dh, dc, dgates, bs, H);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(stfast_emu, CPU, m) {
  m.impl("lstm_forward", &lstm::run_forward<EmuBackend>);
  m.impl("lstm_backward", &lstm::run_backward<EmuBackend>);
}

}  // namespace emu
}  // namespace stfast
