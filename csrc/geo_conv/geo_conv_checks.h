// Argument checks of the geo-conv ops, shared by the CPU and CUDA host code (host only).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace stfast {
namespace geo_conv {

// Sizes: B trips, N packed points, N_out = N - B (k - 1) output rows, F = F_in, H hidden, C channels.
struct Dims {
  int64_t B, N, N_out, F, H, C, k;
};

// Sizes read off the (already rank-checked) inputs: B trips, N points, F features, H hidden, C channels,
// k kernel, N_out = N − B (k − 1) output rows.
inline Dims dims_of(const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& proj_weight,
                    const at::Tensor& conv_weight) {
  Dims d;
  d.B = offsets.size(0) - 1;
  d.N = points.size(0);
  d.F = points.size(1);
  d.H = proj_weight.size(0);
  d.C = conv_weight.size(0);
  d.k = conv_weight.size(2);
  d.N_out = d.N - d.B * (d.k - 1);
  return d;
}

inline void check_same(const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), "stfast.geo_conv: ", name, " is on ", t.device(), " but points on ",
              ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "stfast.geo_conv: ", name, " has dtype ", t.scalar_type(),
              " but points have ", ref.scalar_type());
}

inline Dims check_forward_args(const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& local_dist,
                               const at::Tensor& proj_weight, const at::Tensor& proj_bias,
                               const at::Tensor& conv_weight, const at::Tensor& conv_bias) {
  TORCH_CHECK(points.dim() == 2, "stfast.geo_conv: points must be (N, F_in), got ", points.sizes());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1 && offsets.scalar_type() == at::kLong,
              "stfast.geo_conv: offsets must be int64 (B + 1,), got ", offsets.scalar_type(), " ", offsets.sizes());
  TORCH_CHECK(offsets.device() == points.device(), "stfast.geo_conv: offsets on ", offsets.device(),
              " but points on ", points.device());
  TORCH_CHECK(proj_weight.dim() == 2 && proj_weight.size(1) == points.size(1),
              "stfast.geo_conv: proj_weight must be (H, F_in=", points.size(1), "), got ", proj_weight.sizes());
  TORCH_CHECK(conv_weight.dim() == 3 && conv_weight.size(1) == proj_weight.size(0),
              "stfast.geo_conv: conv_weight must be (C, H=", proj_weight.size(0), ", k), got ", conv_weight.sizes());
  Dims d = dims_of(points, offsets, proj_weight, conv_weight);
  TORCH_CHECK(d.k >= 1, "stfast.geo_conv: kernel size must be >= 1");
  TORCH_CHECK_VALUE(d.N_out >= d.B, "stfast.geo_conv: ", d.N, " points cannot hold ", d.B,
                    " trips of at least kernel_size=", d.k, " points");
  TORCH_CHECK(proj_bias.dim() == 1 && proj_bias.size(0) == d.H, "stfast.geo_conv: proj_bias must be (H,)");
  TORCH_CHECK(conv_bias.dim() == 1 && conv_bias.size(0) == d.C, "stfast.geo_conv: conv_bias must be (C,)");
  TORCH_CHECK(local_dist.dim() == 1 && local_dist.size(0) == d.N_out, "stfast.geo_conv: local_dist must be (",
              d.N_out, ",) = N - B (k - 1), got ", local_dist.sizes());
  check_same(points, local_dist, "local_dist");
  check_same(points, proj_weight, "proj_weight");
  check_same(points, proj_bias, "proj_bias");
  check_same(points, conv_weight, "conv_weight");
  check_same(points, conv_bias, "conv_bias");
  return d;
}

inline Dims check_backward_args(const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets,
                                const at::Tensor& hidden, const at::Tensor& out, const at::Tensor& proj_weight,
                                const at::Tensor& conv_weight) {
  TORCH_CHECK(points.dim() == 2 && offsets.dim() == 1 && offsets.size(0) >= 1 && offsets.scalar_type() == at::kLong,
              "stfast.geo_conv_backward: bad points/offsets");
  TORCH_CHECK(offsets.device() == points.device(), "stfast.geo_conv_backward: offsets and points on different devices");
  TORCH_CHECK(proj_weight.dim() == 2 && conv_weight.dim() == 3, "stfast.geo_conv_backward: bad weights");
  Dims d = dims_of(points, offsets, proj_weight, conv_weight);
  TORCH_CHECK(proj_weight.size(1) == d.F && conv_weight.size(1) == d.H, "stfast.geo_conv_backward: bad weight shapes");
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) == d.N && hidden.size(1) == d.H,
              "stfast.geo_conv_backward: hidden must be (N, H)");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == d.N_out && out.size(1) == d.C + 1,
              "stfast.geo_conv_backward: out must be (N_out, C + 1)");
  TORCH_CHECK(grad_out.sizes() == out.sizes(), "stfast.geo_conv_backward: grad_out must be (N_out, C + 1)");
  check_same(points, grad_out, "grad_out");
  check_same(points, hidden, "hidden");
  check_same(points, out, "out");
  check_same(points, proj_weight, "proj_weight");
  check_same(points, conv_weight, "conv_weight");
  return d;
}

}  // namespace geo_conv
}  // namespace stfast
