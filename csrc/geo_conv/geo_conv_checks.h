// The one validation path of the geo-conv ops (host only): the CPU and the CUDA kernel both call
// check_forward_args / check_backward_args before they touch any data, so both devices reject the same
// inputs with the same error text (pytorch_scatter's pattern: argument checks in one place, kernels
// after them).
//
// offsets are host data on both devices (like lstm_forward's lengths): a CPU int64 tensor, read here
// in full (offsets[0] == 0, every trip >= kernel_size points, offsets[B] == N) without syncing any GPU
// stream; the CUDA kernel uploads its own copy afterwards. Once these checks pass, every index a
// kernel derives from offsets lies inside its buffer.
//
// Errors: ValueError (TORCH_CHECK_VALUE) for bad offset values, RuntimeError (TORCH_CHECK) for bad
// ranks, shapes, dtypes and devices. Every message starts with the op's name.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace stfast {
namespace geo_conv {

// Sizes: B trips, N packed points, N_out = N - B (k - 1) output rows, F = F_in, H hidden, C channels,
// k kernel size.
struct Dims {
  int64_t B, N, N_out, F, H, C, k;
};

inline void check_same(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but points on ", ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
              " but points have ", ref.scalar_type());
}

// Floating dtypes of points: float32/float64, and float16/bfloat16 (float32 accumulation) on every device.
// One message for every device.
inline void check_dtype(const char* op, const at::Tensor& points) {
  const auto t = points.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, op,
              ": points must be float32, float64, float16 or bfloat16, got ", t, " on ", points.device());
}

// offsets (B + 1,) int64 on the CPU; returns B. Value checks in CSR order, each naming the offending
// entry; no subtraction can overflow because every offset is first bounded by [0, N].
inline int64_t check_offsets(const char* op, const at::Tensor& offsets, int64_t N, int64_t k) {
  TORCH_CHECK(offsets.device().is_cpu(), op, ": offsets must be a CPU tensor (host data: checked before any launch "
              "without syncing the GPU; keep the host copy of the batch's offsets), got offsets on ",
              offsets.device());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1 && offsets.scalar_type() == at::kLong, op,
              ": offsets must be int64 (B + 1,), got ", offsets.scalar_type(), " ", offsets.sizes());
  const at::Tensor off_c = offsets.contiguous();
  const int64_t* off = off_c.const_data_ptr<int64_t>();
  const int64_t B = offsets.size(0) - 1;
  TORCH_CHECK_VALUE(off[0] == 0, op, ": offsets[0] must be 0, got ", off[0]);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_VALUE(off[b + 1] >= off[b], op, ": offsets must be non-decreasing; offsets[", b + 1, "] = ",
                      off[b + 1], " < offsets[", b, "] = ", off[b]);
    TORCH_CHECK_VALUE(off[b + 1] <= N, op, ": offsets[", b + 1, "] = ", off[b + 1], " exceeds N = ", N,
                      " (points' rows)");
    const int64_t len = off[b + 1] - off[b];
    TORCH_CHECK_VALUE(len >= k, op, ": trip ", b, " has ", len,
                      " points; the geo-convolution needs at least kernel_size=", k,
                      " points per trip (drop shorter trips in preprocessing)");
  }
  TORCH_CHECK_VALUE(off[B] == N, op, ": offsets[B] = offsets[", B, "] = ", off[B], " must equal N = ", N,
                    " (points' rows): every point belongs to one trip");
  return B;
}

// points (N, F), proj_weight (H, F), conv_weight (C, H, k) with k >= 1, offsets valid for them.
inline Dims check_common(const char* op, const at::Tensor& points, const at::Tensor& offsets,
                         const at::Tensor& proj_weight, const at::Tensor& conv_weight) {
  TORCH_CHECK(points.dim() == 2, op, ": points must be (N, F_in), got ", points.sizes());
  check_dtype(op, points);
  TORCH_CHECK(proj_weight.dim() == 2 && proj_weight.size(1) == points.size(1), op, ": proj_weight must be (H, F_in=",
              points.size(1), "), got ", proj_weight.sizes());
  TORCH_CHECK(conv_weight.dim() == 3 && conv_weight.size(1) == proj_weight.size(0), op,
              ": conv_weight must be (C, H=", proj_weight.size(0), ", k), got ", conv_weight.sizes());
  check_same(op, points, proj_weight, "proj_weight");
  check_same(op, points, conv_weight, "conv_weight");
  Dims d;
  d.N = points.size(0);
  d.F = points.size(1);
  d.H = proj_weight.size(0);
  d.C = conv_weight.size(0);
  d.k = conv_weight.size(2);
  TORCH_CHECK(d.k >= 1, op, ": kernel size (conv_weight.size(2)) must be >= 1, got ", d.k);
  d.B = check_offsets(op, offsets, d.N, d.k);
  d.N_out = d.N - d.B * (d.k - 1);  // >= B >= 0: every trip holds >= k points
  return d;
}

inline Dims check_forward_args(const at::Tensor& points, const at::Tensor& offsets, const at::Tensor& local_dist,
                               const at::Tensor& proj_weight, const at::Tensor& proj_bias,
                               const at::Tensor& conv_weight, const at::Tensor& conv_bias) {
  constexpr const char* op = "stfast.geo_conv";
  const Dims d = check_common(op, points, offsets, proj_weight, conv_weight);
  TORCH_CHECK(proj_bias.dim() == 1 && proj_bias.size(0) == d.H, op, ": proj_bias must be (H=", d.H, ",), got ",
              proj_bias.sizes());
  TORCH_CHECK(conv_bias.dim() == 1 && conv_bias.size(0) == d.C, op, ": conv_bias must be (C=", d.C, ",), got ",
              conv_bias.sizes());
  TORCH_CHECK(local_dist.dim() == 1 && local_dist.size(0) == d.N_out, op, ": local_dist must be (", d.N_out,
              ",) = N - B (k - 1), got ", local_dist.sizes());
  check_same(op, points, local_dist, "local_dist");
  check_same(op, points, proj_bias, "proj_bias");
  check_same(op, points, conv_bias, "conv_bias");
  return d;
}

inline Dims check_backward_args(const at::Tensor& grad_out, const at::Tensor& points, const at::Tensor& offsets,
                                const at::Tensor& hidden, const at::Tensor& out, const at::Tensor& proj_weight,
                                const at::Tensor& conv_weight) {
  constexpr const char* op = "stfast.geo_conv_backward";
  const Dims d = check_common(op, points, offsets, proj_weight, conv_weight);
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) == d.N && hidden.size(1) == d.H, op, ": hidden must be (N=", d.N,
              ", H=", d.H, "), got ", hidden.sizes());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == d.N_out && out.size(1) == d.C + 1, op, ": out must be (N_out=",
              d.N_out, ", C + 1=", d.C + 1, "), got ", out.sizes());
  TORCH_CHECK(grad_out.sizes() == out.sizes(), op, ": grad_out must be (N_out=", d.N_out, ", C + 1=", d.C + 1,
              "), got ", grad_out.sizes());
  check_same(op, points, grad_out, "grad_out");
  check_same(op, points, hidden, "hidden");
  check_same(op, points, out, "out");
  return d;
}

}  // namespace geo_conv
}  // namespace stfast
