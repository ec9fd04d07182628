// The schemas of stfast's kernel ops, as strings: csrc/ops.cpp registers them under torch.ops.stfast, and
// the CUDA emulator (csrc/emu/emu_ops.cpp) the same ones under torch.ops.stfast_emu, so both namespaces
// take exactly the same arguments (the emulator's geo_conv_backward adds the device's SM count).
#pragma once

namespace stfast {
namespace schema {

// Fused geo-convolution over packed trips (see csrc/geo_conv/geo_conv.h for the math).
//   points (N, F_in), offsets (B + 1,) int64 on the CPU (host data: checked in full before any launch,
//   csrc/geo_conv/geo_conv_checks.h), local_dist (N - B (k - 1),)
//   -> out (N - B (k - 1), C + 1), hidden (N, H) = tanh(projection), saved for the backward.
constexpr const char* kGeoConvForward =
    "geo_conv_forward(Tensor points, Tensor offsets, Tensor local_dist, Tensor proj_weight, "
    "Tensor proj_bias, Tensor conv_weight, Tensor conv_bias) -> (Tensor out, Tensor hidden)";
// Backward of geo_conv_forward for points and every weight and bias (deterministic); ARGS_END closes the
// argument list (the emulator inserts its SM count there).
#define STFAST_GEO_CONV_BACKWARD_SCHEMA(ARGS_END)                                                       \
  "geo_conv_backward(Tensor grad_out, Tensor points, Tensor offsets, Tensor hidden, Tensor out, "       \
  "Tensor proj_weight, Tensor conv_weight" ARGS_END ") -> (Tensor grad_points, Tensor grad_proj_weight, " \
  "Tensor grad_proj_bias, Tensor grad_conv_weight, Tensor grad_conv_bias)"

// Fused variable-length multi-layer LSTM (see csrc/lstm/lstm_driver.h, stfast/ops/lstm.py):
//   input (N, I) packed or (B, T, I) / (T, B, I) padded, by layout (0 packed CSR, 1 padded batch-first,
//   2 padded time-first, 3 packed time-major as PackedSequence.data); lengths (B,) int64 on the CPU;
//   weights: torch.nn.LSTM's per layer [w_ih, w_hh(, b_ih, b_hh)]; h0, c0 (L, B, H)
//   -> output (input's layout, H columns), h_n, c_n (L, B, H); gates (L, M, 4H), cells (L, M, H),
//   hiddens (L, M, H) saved for the backward (M = input rows).
constexpr const char* kLstmForward =
    "lstm_forward(Tensor input, Tensor lengths, Tensor[] weights, Tensor? h0, Tensor? c0, int num_layers, "
    "int layout) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells, Tensor hiddens)";
// Backward of lstm_forward for input, every weight and bias, h0 and c0 (deterministic); input_grad false
// skips the input's gradient (grad_input then has 0 elements).
constexpr const char* kLstmBackward =
    "lstm_backward(Tensor grad_output, Tensor? grad_h_n, Tensor? grad_c_n, Tensor input, Tensor lengths, "
    "Tensor[] weights, Tensor? h0, Tensor? c0, Tensor gates, Tensor cells, Tensor hiddens, int num_layers, "
    "int layout, bool input_grad=True) -> (Tensor grad_input, Tensor[] grad_weights, Tensor grad_h0, Tensor grad_c0)";

}  // namespace schema
}  // namespace stfast
