// The GPU's launcher for the launch functions of csrc/*/*_kernels.h: kernels on the current stream,
// workspaces from the caching allocator (freed when the launcher goes; stream order keeps that safe),
// and the current device's SM count. The emulator's counterpart is csrc/emu/emu_launcher.h.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <utility>
#include <vector>

namespace stfast {

class CudaLauncher {
 public:
  // like: a tensor on the device to launch on (its device becomes current for the launcher's life).
  explicit CudaLauncher(const at::Tensor& like)
      : guard_(std::in_place, like.device()), options_(like.options()), stream_(at::cuda::getCurrentCUDAStream()) {}
  // On the current device (the caller holds the device guard).
  CudaLauncher()
      : options_(at::TensorOptions().device(at::kCUDA, c10::cuda::current_device())),
        stream_(at::cuda::getCurrentCUDAStream()) {}

  int64_t sm_count() const { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) const { return at::empty(sizes, options); }

  template <typename U>
  U* workspace(int64_t n) {
    buffers_.push_back(at::empty({n}, options_.dtype(c10::CppTypeToScalarType<U>::value)));
    return buffers_.back().template data_ptr<U>();
  }

  template <class... P, class... Args>
  void launch(const char* /*name*/, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
              Args&&... args) {
    kernel<<<grid, block, shared_bytes, stream_>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Host-validated offsets onto the device without a sync: staged through pinned memory from torch's
  // caching host allocator, which keeps the block until the copy on the current stream is done.
  at::Tensor device_copy(const at::Tensor& host) const {
    at::Tensor pinned = host.contiguous();
    if (!pinned.is_pinned()) pinned = pinned.pin_memory();
    return pinned.to(pinned.options().device(options_.device()), /*non_blocking=*/true);
  }

  cudaStream_t stream() const { return stream_; }

 private:
  std::optional<c10::cuda::CUDAGuard> guard_;
  at::TensorOptions options_;
  cudaStream_t stream_;
  std::vector<at::Tensor> buffers_;
};

}  // namespace stfast
