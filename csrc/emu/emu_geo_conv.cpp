// stfast_emu::geo_conv_forward / geo_conv_backward: geo_conv_ops.h, the CUDA path from arguments to
// kernels, on the emulator's launcher.
#include <torch/library.h>

#include "emu_launcher.h"  // first: the kernel headers define the device vocabulary as macros

#include "../geo_conv/geo_conv_ops.h"

namespace stfast {
namespace emu {
namespace {

std::tuple<at::Tensor, at::Tensor> geo_conv_forward_emu(const at::Tensor& points, const at::Tensor& offsets,
                                                         const at::Tensor& local_dist, const at::Tensor& proj_weight,
                                                         const at::Tensor& proj_bias, const at::Tensor& conv_weight,
                                                         const at::Tensor& conv_bias) {
  return geo_conv::forward_op<EmuLauncher>(points, offsets, local_dist, proj_weight, proj_bias, conv_weight,
                                           conv_bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geo_conv_backward_emu(
    const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& hidden,
    const at::Tensor& out, const at::Tensor& proj_weight, const at::Tensor& conv_weight, int64_t sm_count) {
  return geo_conv::backward_op<EmuLauncher>(grad_out, points, offsets, hidden, out, proj_weight, conv_weight,
                                            sm_count);
}

}  // namespace

TORCH_LIBRARY_IMPL(stfast_emu, CPU, m) {
  m.impl("geo_conv_forward", &geo_conv_forward_emu);
  m.impl("geo_conv_backward", &geo_conv_backward_emu);
}

}  // namespace emu
}  // namespace stfast
