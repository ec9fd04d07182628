// The device-code vocabulary the kernel headers (csrc/*/*_kernels.h) use: nvcc's own, or the CUDA
// emulator's (csrc/emu/cuda_emu.h) when the host compiler builds them. STFAST_SHARED(T, name, n) declares
// a per-block shared array of n T: `__shared__ T name[n]` on a GPU; in the emulator a pointer to the
// block's copy (poisoned until written, see cuda_emu.h).
#pragma once

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define STFAST_SHARED(T, name, n) __shared__ T name[n]
#else
#include "../emu/cuda_emu.h"
// The static tag names the declaration (one per expansion and template instantiation): a block gets one
// copy per declaration, however often a device function that declares it runs, as on a GPU.
#define STFAST_SHARED(T, name, n)            \
  static const char stfast_shared_##name = 0; \
  T* const name = static_cast<T*>(::stfast::emu::shared_array(sizeof(T) * (n), #name, &stfast_shared_##name))

// ---- device-code vocabulary, as the CUDA headers spell it ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define blockIdx (::stfast::emu::current().block_idx)
#define threadIdx (::stfast::emu::current().thread_idx)
#define blockDim (::stfast::emu::current().block_dim)
#define gridDim (::stfast::emu::current().grid_dim)
#define __syncthreads() ::stfast::emu::syncthreads(__FILE__, __LINE__)
using dim3 = ::stfast::emu::dim3;

// Warp-level features are refused at compile time: the emulator has no warps (yet).
#define STFAST_EMU_NO_WARP(what) \
  ([] { static_assert(sizeof(int) == 0, "stfast emu: " what " is not emulated (csrc/emu/cuda_emu.h)"); }(), 0)
#define warpSize STFAST_EMU_NO_WARP("warpSize")
#define __syncwarp(...) STFAST_EMU_NO_WARP("__syncwarp")
#define __shfl_sync(...) STFAST_EMU_NO_WARP("__shfl_sync")
#define __shfl_up_sync(...) STFAST_EMU_NO_WARP("__shfl_up_sync")
#define __shfl_down_sync(...) STFAST_EMU_NO_WARP("__shfl_down_sync")
#define __shfl_xor_sync(...) STFAST_EMU_NO_WARP("__shfl_xor_sync")
#define __ballot_sync(...) STFAST_EMU_NO_WARP("__ballot_sync")
#define __any_sync(...) STFAST_EMU_NO_WARP("__any_sync")
#define __all_sync(...) STFAST_EMU_NO_WARP("__all_sync")
#define __activemask(...) STFAST_EMU_NO_WARP("__activemask")
#define atomicAdd(...) STFAST_EMU_NO_WARP("atomicAdd")
#endif
