// CUDA kernels of stfast::geo_conv_forward / stfast::geo_conv_backward (schemas in csrc/ops.cpp): the ops
// of geo_conv_ops.h on the GPU's launcher. The kernels and their launch arithmetic are geo_conv_kernels.h,
// which the CUDA emulator also runs in every CPU build (csrc/emu/, tests/test_cuda_emulated.py). All
// launches go to the current stream, buffers come from the caching allocator, and nothing synchronizes
// the host: offsets arrive on the host, are validated there in full (geo_conv_checks.h, the CPU kernel's
// checks) and then uploaded through pinned memory.
#include <torch/library.h>

#include "../common/cuda_launcher.cuh"
#include "geo_conv_ops.h"

namespace stfast {
namespace geo_conv {
namespace {

std::tuple<at::Tensor, at::Tensor> geo_conv_forward_cuda(const at::Tensor& points, const at::Tensor& offsets,
                                                          const at::Tensor& local_dist, const at::Tensor& proj_weight,
                                                          const at::Tensor& proj_bias, const at::Tensor& conv_weight,
                                                          const at::Tensor& conv_bias) {
  return forward_op<CudaLauncher>(points, offsets, local_dist, proj_weight, proj_bias, conv_weight, conv_bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geo_conv_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& hidden,
    const at::Tensor& out, const at::Tensor& proj_weight, const at::Tensor& conv_weight) {
  return backward_op<CudaLauncher>(grad_out, points, offsets, hidden, out, proj_weight, conv_weight);
}

}  // namespace

TORCH_LIBRARY_IMPL(stfast, CUDA, m) {
  m.impl("geo_conv_forward", &geo_conv_forward_cuda);
  m.impl("geo_conv_backward", &geo_conv_backward_cuda);
}

}  // namespace geo_conv
}  // namespace stfast
