// The CUDA emulator's scheduler (csrc/emu/cuda_emu.h): blocks in sequence; a block's threads as fibers run
// one after another between barriers (kForward / kReverse), or as OS threads at a real barrier (kParallel).
#include "cuda_emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define STFAST_EMU_ASAN 1
#define STFAST_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define STFAST_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define STFAST_POISON(p, n) ((void)(p), (void)(n))
#define STFAST_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define STFAST_EMU_TSAN 1
#endif

namespace stfast {
namespace emu {

namespace {

std::atomic<Schedule> g_schedule{Schedule::kForward};
thread_local ThreadState t_state;

constexpr std::size_t kMaxStaticShared = 48 * 1024;  // CUDA's static shared memory per block
constexpr std::size_t kRedzone = 64;                 // between shared arrays (poisoned under ASan)
// CUDA's limit plus the redzones of up to 16 arrays (a kernel with fewer arrays may exceed the limit by
// the unused redzones: under 1 KiB).
constexpr std::size_t kArenaBytes = kMaxStaticShared + 16 * kRedzone;
constexpr std::size_t kFiberStack = 256 * 1024;      // kernels are shallow; sanitizers widen frames

// Thrown inside a worker of the parallel schedule when its block's barrier cannot complete: unwinds the
// kernel's frames back to the worker.
struct BarrierAbandoned {};

enum class FiberState { kReady, kAtBarrier, kDone };

struct Fiber {
  ucontext_t ctx;
  FiberState state = FiberState::kReady;
  uint3 tid;
  SharedLayout shared;
  const char* barrier_file = nullptr;  // the __syncthreads() it waits at
  int barrier_line = 0;
#ifdef STFAST_EMU_ASAN
  void* fake_stack = nullptr;
#endif
#ifdef STFAST_EMU_TSAN
  void* tsan_fiber = nullptr;
#endif
};

}  // namespace

struct Block {
  const char* kernel;
  uint3 idx;
  std::size_t nthreads;
  bool sequential;
  unsigned char* arena = nullptr;  // kArenaBytes of shared memory, 0xFF at the block's start
  std::mutex mu;                   // the parallel schedule's barrier
  // parallel schedule: a reusable barrier that counts threads that have returned
  std::condition_variable cv;
  std::size_t arrived = 0, exited = 0;
  std::uint64_t generation = 0;
  bool broken = false;
  const char* barrier_file = nullptr;  // the call site of the current generation's first arrival
  int barrier_line = 0;
  // sequential schedule
  Fiber* running = nullptr;
  ucontext_t scheduler;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
#ifdef STFAST_EMU_ASAN
  const void* sched_stack_bottom = nullptr;
  std::size_t sched_stack_size = 0;
  void* sched_fake_stack = nullptr;
#endif
#ifdef STFAST_EMU_TSAN
  void* sched_tsan_fiber = nullptr;
#endif

  std::string where() const {
    std::ostringstream s;
    s << "kernel " << kernel << ", block (" << idx.x << ", " << idx.y << ", " << idx.z << ")";
    return s.str();
  }
};

void set_schedule(Schedule s) { g_schedule.store(s); }
Schedule schedule() { return g_schedule.load(); }
const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kForward: return "forward";
    case Schedule::kReverse: return "reverse";
    case Schedule::kParallel: return "parallel";
  }
  return "?";
}

ThreadState& current() { return t_state; }

// "file:line", the file without its folders.
static std::string site(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

void* shared_array(std::size_t bytes, const char* name, const void* tag) {
  Block* b = t_state.block;
  if (b == nullptr) throw LaunchError(std::string("stfast emu: shared array ") + name + " declared outside a kernel");
  SharedLayout& layout = *t_state.shared;
  for (const auto& [placed_tag, offset, size] : layout.placed)
    if (placed_tag == tag) {
      if (size != bytes)  // a GPU's static array has one size; here only a bug of the macro could differ
        throw LaunchError("stfast emu: " + b->where() + ": shared array " + name + " declared again with " +
                          std::to_string(bytes) + " bytes, first " + std::to_string(size));
      return b->arena + offset;
    }
  const std::size_t start = layout.used + kRedzone;
  const std::size_t end = start + ((bytes + 15) / 16) * 16;
  if (end + kRedzone > kArenaBytes)
    throw LaunchError("stfast emu: " + b->where() + ": shared array " + name + " (" + std::to_string(bytes) +
                      " bytes) exceeds the " + std::to_string(kMaxStaticShared) + " bytes of shared memory per block");
  layout.used = end;
  layout.placed.emplace_back(tag, start, bytes);
  unsigned char* p = b->arena + start;
  STFAST_UNPOISON(p, bytes);
  return p;
}

namespace {

// ---- sequential schedule: fibers ----

#ifdef STFAST_EMU_ASAN
void asan_start_switch(void** save, const void* bottom, std::size_t size) {
  __sanitizer_start_switch_fiber(save, bottom, size);
}
void asan_finish_switch(void* save, const void** bottom, std::size_t* size) {
  __sanitizer_finish_switch_fiber(save, bottom, size);
}
#endif

// Back from a fiber to the block's scheduler; `final`: the fiber will never run again.
void switch_to_scheduler(Block* b, Fiber* f, bool final) {
#ifdef STFAST_EMU_ASAN
  asan_start_switch(final ? nullptr : &f->fake_stack, b->sched_stack_bottom, b->sched_stack_size);
#endif
#ifdef STFAST_EMU_TSAN
  __tsan_switch_to_fiber(b->sched_tsan_fiber, 0);
#endif
  swapcontext(&f->ctx, &b->scheduler);
#ifdef STFAST_EMU_ASAN
  asan_finish_switch(f->fake_stack, &b->sched_stack_bottom, &b->sched_stack_size);
#endif
  (void)final;
}

// The fiber's entry: the block comes through t_state (set by the scheduler before every switch).
void fiber_main() {
  Block* b = t_state.block;
  Fiber* f = b->running;
#ifdef STFAST_EMU_ASAN
  asan_finish_switch(nullptr, &b->sched_stack_bottom, &b->sched_stack_size);
#endif
  try {
    (*b->body)();
  } catch (...) {
    if (!b->error) b->error = std::current_exception();
  }
  f->state = FiberState::kDone;
  switch_to_scheduler(b, f, /*final=*/true);
  std::abort();  // a finished fiber is never resumed
}

struct FiberStacks {
  std::vector<void*> stacks;
  ~FiberStacks() {
    for (void* s : stacks) munmap(s, kFiberStack);
  }
  void* get(std::size_t i) {
    while (stacks.size() <= i) {
      void* s = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (s == MAP_FAILED) throw std::bad_alloc();
      mprotect(s, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);  // guard page: overflow faults
      stacks.push_back(s);
    }
    return stacks[i];
  }
};

void run_block_sequential(Block& b, const dim3& block, bool reverse, FiberStacks& stacks) {
  std::vector<Fiber> fibers(b.nthreads);
  std::size_t i = 0;
  for (unsigned int z = 0; z < block.z; ++z)
    for (unsigned int y = 0; y < block.y; ++y)
      for (unsigned int x = 0; x < block.x; ++x, ++i) {
        Fiber& f = fibers[i];
        f.tid = uint3{x, y, z};
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = stacks.get(i);
        f.ctx.uc_stack.ss_size = kFiberStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
#ifdef STFAST_EMU_TSAN
        f.tsan_fiber = __tsan_create_fiber(0);
#endif
      }
#ifdef STFAST_EMU_TSAN
  b.sched_tsan_fiber = __tsan_get_current_fiber();
#endif
  std::string failure;
  for (std::size_t phase = 0;; ++phase) {
    std::size_t at_barrier = 0, done = 0;
    for (std::size_t k = 0; k < b.nthreads; ++k) {
      Fiber& f = fibers[reverse ? b.nthreads - 1 - k : k];
      if (f.state == FiberState::kDone) {
        ++done;
        continue;
      }
      f.state = FiberState::kReady;
      t_state.thread_idx = f.tid;
      t_state.shared = &f.shared;
      b.running = &f;
#ifdef STFAST_EMU_ASAN
      asan_start_switch(&b.sched_fake_stack, static_cast<char*>(f.ctx.uc_stack.ss_sp), kFiberStack);
#endif
#ifdef STFAST_EMU_TSAN
      __tsan_switch_to_fiber(f.tsan_fiber, 0);
#endif
      swapcontext(&b.scheduler, &f.ctx);
#ifdef STFAST_EMU_ASAN
      asan_finish_switch(b.sched_fake_stack, nullptr, nullptr);
#endif
      if (f.state == FiberState::kAtBarrier) ++at_barrier;
      else ++done;
    }
    if (b.error) break;
    if (at_barrier == 0) break;  // every thread returned
    if (done > 0) {
      std::ostringstream s;
      s << "stfast emu: " << b.where() << ": __syncthreads() reached by " << at_barrier << " of " << b.nthreads
        << " threads (" << done << " returned without it; barrier " << phase + 1 << ")";
      failure = s.str();
      break;
    }
    std::vector<std::pair<std::string, std::size_t>> sites;  // call site -> threads waiting there
    for (const Fiber& f : fibers) {
      const std::string at = site(f.barrier_file, f.barrier_line);
      auto it = std::find_if(sites.begin(), sites.end(), [&](const auto& e) { return e.first == at; });
      if (it == sites.end()) sites.emplace_back(at, 1);
      else ++it->second;
    }
    if (sites.size() > 1) {
      std::ostringstream s;
      s << "stfast emu: " << b.where() << ": threads met at different __syncthreads() call sites (";
      for (std::size_t k = 0; k < sites.size(); ++k)
        s << (k ? ", " : "") << sites[k].first << " by " << sites[k].second << " threads";
      s << "; barrier " << phase + 1 << ")";
      failure = s.str();
      break;
    }
  }
#ifdef STFAST_EMU_TSAN
  for (Fiber& f : fibers) __tsan_destroy_fiber(f.tsan_fiber);
#endif
  if (b.error || !failure.empty())  // abandoned frames leave their redzones poisoned on the reused stacks
    for (Fiber& f : fibers) STFAST_UNPOISON(f.ctx.uc_stack.ss_sp, kFiberStack);
  if (b.error) std::rethrow_exception(b.error);
  if (!failure.empty()) throw LaunchError(failure);
}

// ---- parallel schedule: OS threads ----

void run_block_parallel(Block& b, const dim3& block, const ThreadState& launch) {
  std::vector<std::thread> workers;
  workers.reserve(b.nthreads);
  std::string failure;
  std::exception_ptr error;
  std::mutex err_mu;
  auto worker = [&](uint3 tid) {
    t_state = launch;
    t_state.block = &b;
    t_state.thread_idx = tid;
    SharedLayout layout;
    t_state.shared = &layout;
    try {
      (*b.body)();
    } catch (const BarrierAbandoned&) {
    } catch (...) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!error) error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(b.mu);
    ++b.exited;
    if (b.arrived > 0 && b.arrived + b.exited == b.nthreads) {  // the others wait at a barrier we never reach
      b.broken = true;
      b.cv.notify_all();
    }
  };
  for (unsigned int z = 0; z < block.z; ++z)
    for (unsigned int y = 0; y < block.y; ++y)
      for (unsigned int x = 0; x < block.x; ++x) workers.emplace_back(worker, uint3{x, y, z});
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  if (b.broken) {
    std::ostringstream s;
    s << "stfast emu: " << b.where() << ": __syncthreads() reached by " << b.arrived << " of " << b.nthreads
      << " threads (" << b.nthreads - b.arrived << " returned without it)";
    throw LaunchError(s.str());
  }
}

std::mutex g_log_mu;

}  // namespace

void syncthreads(const char* file, int line) {
  Block* b = t_state.block;
  if (b == nullptr) throw LaunchError("stfast emu: __syncthreads() outside a kernel");
  if (b->sequential) {
    Fiber* f = b->running;
    f->state = FiberState::kAtBarrier;
    f->barrier_file = file;
    f->barrier_line = line;
    switch_to_scheduler(b, f, /*final=*/false);
    return;
  }
  std::unique_lock<std::mutex> lock(b->mu);
  if (b->broken) throw BarrierAbandoned{};
  if (b->arrived == 0) {
    b->barrier_file = file;
    b->barrier_line = line;
  } else if (b->barrier_line != line || std::strcmp(b->barrier_file, file) != 0) {
    b->broken = true;  // the others wait at a barrier this thread will not complete
    b->cv.notify_all();
    throw LaunchError("stfast emu: " + b->where() + ": threads met at different __syncthreads() call sites (" +
                      site(b->barrier_file, b->barrier_line) + " and " + site(file, line) + ")");
  }
  const std::uint64_t gen = b->generation;
  if (++b->arrived + b->exited == b->nthreads) {
    if (b->exited > 0) {
      b->broken = true;
      b->cv.notify_all();
      throw BarrierAbandoned{};
    }
    b->arrived = 0;
    ++b->generation;
    b->cv.notify_all();
    return;
  }
  b->cv.wait(lock, [&] { return b->generation != gen || b->broken; });
  if (b->generation == gen) throw BarrierAbandoned{};
}

void log_launch(const char* kernel) {
  const char* path = std::getenv("STFAST_EMU_LOG");
  if (path == nullptr || *path == '\0') return;
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", kernel);
    std::fclose(f);
  }
}

void run_grid(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
              const std::function<void()>& body) {
  const std::size_t nthreads = block.count();
  if (nthreads == 0 || nthreads > kMaxThreadsPerBlock || block.z > 64 || grid.count() == 0 || grid.y > 65535 ||
      grid.z > 65535 || grid.x > 2147483647u) {
    std::ostringstream s;
    s << "stfast emu: kernel " << kernel << ": invalid configuration argument: grid (" << grid.x << ", " << grid.y
      << ", " << grid.z << "), block (" << block.x << ", " << block.y << ", " << block.z << ")";
    throw LaunchError(s.str());
  }
  if (dynamic_shared_bytes != 0)
    throw LaunchError(std::string("stfast emu: kernel ") + kernel + ": dynamic shared memory is not emulated");
  log_launch(kernel);
  const Schedule sched = g_schedule.load();
  const ThreadState saved = t_state;
  ThreadState launch;
  launch.block_dim = block;
  launch.grid_dim = grid;
  thread_local FiberStacks stacks;  // kept for the launching thread's later launches (mmap is not cheap)
  std::unique_ptr<unsigned char[]> arena(new unsigned char[kArenaBytes]);
  try {
    for (unsigned int bz = 0; bz < grid.z; ++bz)
      for (unsigned int by = 0; by < grid.y; ++by)
        for (unsigned int bx = 0; bx < grid.x; ++bx) {
          Block b;
          b.kernel = kernel;
          b.idx = uint3{bx, by, bz};
          b.nthreads = nthreads;
          b.sequential = sched != Schedule::kParallel;
          b.body = &body;
          b.arena = arena.get();
          STFAST_UNPOISON(b.arena, kArenaBytes);
          std::memset(b.arena, 0xFF, kArenaBytes);  // poison: NaN / -1 until a thread writes it
          STFAST_POISON(b.arena, kArenaBytes);      // declarations unpoison their arrays
          launch.block_idx = b.idx;
          if (b.sequential) {
            t_state = launch;
            t_state.block = &b;
            run_block_sequential(b, block, sched == Schedule::kReverse, stacks);
          } else {
            run_block_parallel(b, block, launch);
          }
        }
  } catch (...) {
    STFAST_UNPOISON(arena.get(), kArenaBytes);
    t_state = saved;
    throw;
  }
  STFAST_UNPOISON(arena.get(), kArenaBytes);
  t_state = saved;
}

}  // namespace emu
}  // namespace stfast
