// The geo-conv ops on a launcher: argument checks, outputs and the dtype dispatch around the launch
// functions of geo_conv_kernels.h. geo_conv_cuda.cu instantiates them with the GPU's launcher
// (csrc/common/cuda_launcher.cuh), csrc/emu/emu_geo_conv.cpp with the emulator's: one path from the
// op's arguments to the kernels on both.
//
// Launcher, beyond geo_conv_kernels.h's needs: constructed from the points (and any extra arguments);
// L.empty(sizes, options) an output buffer; L.device_copy(host) host data (the offsets, validated) on
// the launch device, without a host sync.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <tuple>
#include <utility>

#include "geo_conv_checks.h"
#include "geo_conv_kernels.h"

namespace stfast {
namespace geo_conv {

template <class Launcher, class... LauncherArgs>
std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& points, const at::Tensor& offsets,
                                              const at::Tensor& local_dist, const at::Tensor& proj_weight,
                                              const at::Tensor& proj_bias, const at::Tensor& conv_weight,
                                              const at::Tensor& conv_bias, LauncherArgs&&... launcher_args) {
  const Dims d = check_forward_args(points, offsets, local_dist, proj_weight, proj_bias, conv_weight, conv_bias);
  Launcher L(points, std::forward<LauncherArgs>(launcher_args)...);
  auto x = points.contiguous(), ld = local_dist.contiguous();
  auto w1 = proj_weight.contiguous(), b1 = proj_bias.contiguous(), w2 = conv_weight.contiguous(),
       b2 = conv_bias.contiguous();
  const at::Tensor out = L.empty({d.N_out, d.C + 1}, x.options()), h = L.empty({d.N, d.H}, x.options());
  if (d.N == 0) return {out, h};
  const at::Tensor off = L.device_copy(offsets);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "stfast.geo_conv", [&] {
    kernels::launch_forward<scalar_t, at::opmath_type<scalar_t>>(
        L, d.B, d.N, d.N_out, d.F, d.H, d.C, d.k, x.const_data_ptr<scalar_t>(), off.const_data_ptr<int64_t>(),
        ld.const_data_ptr<scalar_t>(), w1.const_data_ptr<scalar_t>(), b1.const_data_ptr<scalar_t>(),
        w2.const_data_ptr<scalar_t>(), b2.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
        h.data_ptr<scalar_t>());
  });
  return {out, h};
}

template <class Launcher, class... LauncherArgs>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& hidden,
    const at::Tensor& out, const at::Tensor& proj_weight, const at::Tensor& conv_weight,
    LauncherArgs&&... launcher_args) {
  const Dims d = check_backward_args(grad_out, points, offsets, hidden, out, proj_weight, conv_weight);
  Launcher L(points, std::forward<LauncherArgs>(launcher_args)...);
  auto x = points.contiguous(), h = hidden.contiguous(), y = out.contiguous();
  auto go = grad_out.contiguous(), w1 = proj_weight.contiguous(), w2 = conv_weight.contiguous();
  if (d.N == 0) {  // no trips: every gradient is empty or zero
    return {L.empty(x.sizes(), x.options()), at::zeros_like(w1), at::zeros({d.H}, w1.options()), at::zeros_like(w2),
            at::zeros({d.C}, w2.options())};
  }
  const at::Tensor off = L.device_copy(offsets);
  const at::Tensor gx = L.empty(x.sizes(), x.options()), gw1 = L.empty(w1.sizes(), w1.options());
  const at::Tensor gb1 = L.empty({d.H}, w1.options()), gw2 = L.empty(w2.sizes(), w2.options());
  const at::Tensor gb2 = L.empty({d.C}, w2.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "stfast.geo_conv_backward", [&] {
    kernels::launch_backward<scalar_t, at::opmath_type<scalar_t>>(
        L, d.B, d.N, d.N_out, d.F, d.H, d.C, d.k, go.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
        off.const_data_ptr<int64_t>(), h.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
        w1.const_data_ptr<scalar_t>(), w2.const_data_ptr<scalar_t>(), gx.data_ptr<scalar_t>(),
        gw1.data_ptr<scalar_t>(), gb1.data_ptr<scalar_t>(), gw2.data_ptr<scalar_t>(), gb2.data_ptr<scalar_t>());
  });
  return {gx, gw1, gb1, gw2, gb2};
}

}  // namespace geo_conv
}  // namespace stfast
