// Every stfast op schema, in one place (TORCH_LIBRARY), plus the module init of stfast._C.
// Kernels are registered per backend with TORCH_LIBRARY_IMPL next to their code (csrc/<op>/);
// autograd and fake (meta) kernels are registered in Python (stfast/ops/).
#include <Python.h>
#include <torch/library.h>

#include "comm/bindings.h"
#include "common/cpu_workspace.h"

namespace stfast {

TORCH_LIBRARY(stfast, m) {
  // Fused geo-convolution over packed trips (see csrc/geo_conv/geo_conv.h for the math).
  //   points (N, F_in), offsets (B + 1,) int64 on the CPU (host data: checked in full before any launch,
  //   csrc/geo_conv/geo_conv_checks.h), local_dist (N - B (k - 1),)
  //   -> out (N - B (k - 1), C + 1), hidden (N, H) = tanh(projection), saved for the backward.
  m.def(
      "geo_conv_forward(Tensor points, Tensor offsets, Tensor local_dist, Tensor proj_weight, "
      "Tensor proj_bias, Tensor conv_weight, Tensor conv_bias) -> (Tensor out, Tensor hidden)");
  // Backward of geo_conv_forward for points and every weight and bias (deterministic).
  m.def(
      "geo_conv_backward(Tensor grad_out, Tensor points, Tensor offsets, Tensor hidden, Tensor out, "
      "Tensor proj_weight, Tensor conv_weight) -> (Tensor grad_points, Tensor grad_proj_weight, "
      "Tensor grad_proj_bias, Tensor grad_conv_weight, Tensor grad_conv_bias)");

  // --- Fused variable-length multi-layer LSTM (see csrc/lstm/lstm_driver.h, stfast/ops/lstm.py) ---
  //   input (N, I) packed or (B, T, I) / (T, B, I) padded, by layout (0 packed CSR, 1 padded batch-first,
  //   2 padded time-first, 3 packed time-major as PackedSequence.data); lengths (B,) int64 on the CPU;
  //   weights: torch.nn.LSTM's per layer [w_ih, w_hh(, b_ih, b_hh)]; h0, c0 (L, B, H)
  //   -> output (input's layout, H columns), h_n, c_n (L, B, H); gates (L, M, 4H), cells (L, M, H),
  //   hiddens (L, M, H) saved for the backward (M = input rows).
  m.def(
      "lstm_forward(Tensor input, Tensor lengths, Tensor[] weights, Tensor? h0, Tensor? c0, int num_layers, "
      "int layout) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells, Tensor hiddens)");
  // Backward of lstm_forward for input, every weight and bias, h0 and c0 (deterministic); input_grad false
  // skips the input's gradient (grad_input then has 0 elements).
  m.def(
      "lstm_backward(Tensor grad_output, Tensor? grad_h_n, Tensor? grad_c_n, Tensor input, Tensor lengths, "
      "Tensor[] weights, Tensor? h0, Tensor? c0, Tensor gates, Tensor cells, Tensor hiddens, int num_layers, "
      "int layout, bool input_grad=True) -> (Tensor grad_input, Tensor[] grad_weights, Tensor grad_h0, Tensor grad_c0)");

  // The CPU kernels' workspace cache (csrc/common/cpu_workspace.h): bytes it holds; return them to the system.
  m.def("cpu_workspace_cached_bytes() -> int",
        [] { return static_cast<int64_t>(CpuWorkspaceAllocator::get().cached_bytes()); });
  m.def("cpu_workspace_empty_cache() -> ()", [] { CpuWorkspaceAllocator::get().empty_cache(); });
}

#ifndef STFAST_WITH_CUDA
// CPU-only build: a CUDA tensor gets a clear message instead of the dispatcher's "no kernel".
namespace {
[[noreturn]] void no_cuda() {
  TORCH_CHECK(false, "stfast was built without CUDA support (rebuild with a CUDA build of torch and nvcc: "
                     "STFAST_CUDA=1 pip install --no-build-isolation -e .)");
}
std::tuple<at::Tensor, at::Tensor> geo_conv_forward_no_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                            const at::Tensor&) {
  no_cuda();
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> geo_conv_backward_no_cuda(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&) {
  no_cuda();
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_forward_no_cuda(
    const at::Tensor&, const at::Tensor&, at::TensorList, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, int64_t, int64_t) {
  no_cuda();
}
std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> lstm_backward_no_cuda(
    const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const at::Tensor&,
    const at::Tensor&, at::TensorList, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool) {
  no_cuda();
}
}  // namespace
TORCH_LIBRARY_IMPL(stfast, CUDA, m) {
  m.impl("geo_conv_forward", &geo_conv_forward_no_cuda);
  m.impl("geo_conv_backward", &geo_conv_backward_no_cuda);
  m.impl("lstm_forward", &lstm_forward_no_cuda);
  m.impl("lstm_backward", &lstm_backward_no_cuda);
}
#endif

}  // namespace stfast

// `import stfast._C` loads this library, which runs the static registrations above; the module
// itself only carries what the build was made with (read by stfast.build_info()).
extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "stfast native ops (registered in torch.ops.stfast)",
                                   -1, nullptr};
  PyObject* m = PyModule_Create(&def);
  if (m == nullptr) return nullptr;
  PyModule_AddStringConstant(m, "stfast_version", STFAST_VERSION);
  PyModule_AddStringConstant(m, "torch_version", STFAST_TORCH_VERSION);
#ifdef STFAST_WITH_CUDA
  PyModule_AddIntConstant(m, "with_cuda", 1);
  PyModule_AddStringConstant(m, "cuda_version", STFAST_CUDA_VERSION);
#else
  PyModule_AddIntConstant(m, "with_cuda", 0);
  Py_INCREF(Py_None);
  PyModule_AddObject(m, "cuda_version", Py_None);
#endif
  // communicator (csrc/comm/): the store bootstrap always, NcclCommunicator with CUDA + NCCL
#ifdef STFAST_WITH_NCCL
  PyModule_AddIntConstant(m, "with_nccl", 1);
#else
  PyModule_AddIntConstant(m, "with_nccl", 0);
#endif
  if (stfast::comm::add_bindings(m) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
