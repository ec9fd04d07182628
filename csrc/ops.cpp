// Every stfast op schema, in one place (TORCH_LIBRARY), plus the module init of stfast._C.
// Kernels are registered per backend with TORCH_LIBRARY_IMPL next to their code (csrc/<op>/);
// autograd and fake (meta) kernels are registered in Python (stfast/ops/).
#include <Python.h>
#include <torch/library.h>

#include "comm/bindings.h"
#include "common/cpu_workspace.h"
#include "common/schemas.h"

namespace stfast {

TORCH_LIBRARY(stfast, m) {
  // The kernel ops (csrc/common/schemas.h: their arguments, shapes and what they return).
  m.def(schema::kGeoConvForward);
  m.def(STFAST_GEO_CONV_BACKWARD_SCHEMA(""));
  m.def(schema::kLstmForward);
  m.def(schema::kLstmBackward);

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
