// The CUDA emulator's launcher for the launch functions of csrc/*/*_kernels.h (the counterpart of
// csrc/common/cuda_launcher.cuh): kernels through csrc/emu/cuda_emu.h on CPU tensors' memory, and every
// buffer it hands out filled with 0xFF bytes (NaN / -1), so a kernel that leaves an output element or a
// workspace element unwritten, or reads one before it is written, fails the comparison every time.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <utility>
#include <vector>

#include "cuda_emu.h"

namespace stfast {
namespace emu {

constexpr int64_t kH200SmCount = 132;  // the GPU the project tests on (docs: ENVIRONMENT.md)

class EmuLauncher {
 public:
  // like: a CPU tensor (the emulated device's memory); sm_count: the emulated device's multiprocessors.
  explicit EmuLauncher(const at::Tensor& like, int64_t sm_count = kH200SmCount)
      : options_(like.options()), sm_count_(sm_count) {
    TORCH_CHECK(like.device().is_cpu(), "stfast_emu: the emulated kernels take CPU tensors, got ", like.device());
    TORCH_CHECK(sm_count >= 1, "stfast_emu: sm_count must be >= 1, got ", sm_count);
  }
  EmuLauncher() : sm_count_(kH200SmCount) {}

  int64_t sm_count() const { return sm_count_; }

  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) const {
    at::Tensor t = at::empty(sizes, options);
    std::memset(t.data_ptr(), 0xFF, t.nbytes());
    return t;
  }

  template <typename U>
  U* workspace(int64_t n) {
    buffers_.push_back(empty({n}, options_.dtype(c10::CppTypeToScalarType<U>::value)));
    return buffers_.back().template data_ptr<U>();
  }

  template <class... P, class... Args>
  void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared_bytes,
              Args&&... args) {
    try {
      emu::launch(name, kernel, grid, block, shared_bytes, std::forward<Args>(args)...);
    } catch (const LaunchError& e) {
      TORCH_CHECK(false, e.what());
    }
  }

  at::Tensor device_copy(const at::Tensor& host) const { return host.contiguous(); }

 private:
  at::TensorOptions options_;
  int64_t sm_count_;
  std::vector<at::Tensor> buffers_;
};

}  // namespace emu
}  // namespace stfast
