// A small CUDA emulator: runs stfast's own __global__ kernels, unchanged, on the CPU (host compiler), so that
// every kernel and its launch arithmetic execute in every build and under the sanitizers (issue 38).
//
// What it emulates: a grid of blocks run one after another; per block, blockDim threads with their
// blockIdx / threadIdx / blockDim / gridDim; per-block shared memory (STFAST_SHARED); __syncthreads().
// Nothing else: warp-level features (shuffles, votes, warpSize, __syncwarp) do not compile here until a
// kernel needs them and this file learns them, and atomics, streams and events are not emulated.
//
// Schedules (set per process with set_schedule, e.g. from tests):
//   kForward  — a block's threads run one after another (fibers), in thread order, each until it reaches
//               __syncthreads() or returns; then the next phase. Deterministic.
//   kReverse  — the same in reverse thread order.
//   kParallel — a block's threads are OS threads meeting at a real barrier (for ThreadSanitizer).
// Shared memory starts every block filled with 0xFF bytes (NaN for floating types, -1 for integers), so in
// a sequential schedule a read of a value another thread has not written yet (a missing barrier) reads
// that poison every time — in kForward when the writer has a higher thread index, in kReverse when lower.
// A __syncthreads() that not every thread of the block reaches, or threads of a block meeting at different
// __syncthreads() call sites (undefined on a GPU; compute-sanitizer synccheck's "divergent" error), is an
// error naming the kernel, the block and the call sites (never a hang), in every schedule.
//
// Only the host compiler sees this header: nvcc compiles the same kernel headers with the real runtime.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#error "csrc/emu/cuda_emu.h is the host emulator; nvcc compiles the kernels with the real CUDA runtime"
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace stfast {
namespace emu {

struct uint3 {
  unsigned int x = 0, y = 0, z = 0;
};

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr std::size_t count() const { return static_cast<std::size_t>(x) * y * z; }
};

enum class Schedule { kForward, kReverse, kParallel };

// The schedule every later launch uses (process-wide; not meant to change while a launch runs).
void set_schedule(Schedule s);
Schedule schedule();
const char* schedule_name(Schedule s);

// An emulated launch that went wrong (a divergent __syncthreads, a bad configuration): what() names the
// kernel and the block.
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// CUDA's per-thread built-in variables. One per OS thread: a sequential schedule runs one fiber at a time
// on the launching thread and sets them before it resumes a fiber; the parallel schedule sets them in
// each worker thread.
struct SharedLayout {
  std::size_t used = 0;  // bytes of the block's shared arena this thread's declarations have taken
  // each declaration met so far (its tag) -> its offset and size in the arena
  std::vector<std::tuple<const void*, std::size_t, std::size_t>> placed;
};
struct ThreadState {
  uint3 block_idx, thread_idx;
  dim3 block_dim, grid_dim;
  struct Block* block = nullptr;
  SharedLayout* shared = nullptr;  // this thread's, for the block it runs in
};
ThreadState& current();

// Device code's __syncthreads() at file:line (the call site all threads of a block must share).
void syncthreads(const char* file, int line);

// The shared array declared at `tag` (STFAST_SHARED's static tag), for a thread of the current block: the
// first time the thread meets the declaration it takes the next place in the block's shared arena after
// the thread's own earlier declarations (no communication between threads, so nothing here orders their
// accesses for ThreadSanitizer), which is the same place for every thread when, as in CUDA, every thread
// passes the same declarations (declare at the top of a kernel or device function, unconditionally); every
// later meeting in the block returns that place again (one copy per block, as a GPU's static shared
// memory). The arena is filled with 0xFF at every block's start, and under AddressSanitizer everything
// outside the declared arrays is poisoned (a read one past an array is reported).
void* shared_array(std::size_t bytes, const char* name, const void* tag);

// Maximum threads per block (as every CUDA device since compute capability 2.0).
constexpr std::size_t kMaxThreadsPerBlock = 1024;

// Runs body for every thread of every block of the grid, in the current schedule. `kernel` names the
// kernel in errors and in the launch log (STFAST_EMU_LOG=FILE: one line per launch).
void run_grid(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
              const std::function<void()>& body);

// Appends the kernel's name to $STFAST_EMU_LOG, when that is set.
void log_launch(const char* kernel);

// Launch a __global__ function (a plain function here) with arguments converted as CUDA does: by value.
template <class... P, class... Args>
void launch(const char* kernel, void (*fn)(P...), dim3 grid, dim3 block, std::size_t shared_bytes, Args&&... args) {
  static_assert(sizeof...(P) == sizeof...(Args), "stfast emu: wrong number of kernel arguments");
  std::tuple<P...> params(static_cast<P>(std::forward<Args>(args))...);
  run_grid(kernel, grid, block, shared_bytes, [&] { std::apply(fn, params); });
}

}  // namespace emu
}  // namespace stfast
