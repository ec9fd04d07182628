// Large CPU workspaces: huge pages, and freed blocks kept for the next call.
//
// Why: a kernel's first touch of fresh memory page-faults, and the kernel zeroes each new page. On the VMs we
// measure on, filling a new 90 MB tensor took 86 ms, one advised MADV_HUGEPAGE 17 ms, a reused one 10 ms.
// The fused LSTM's saved gates and gradient workspaces are that size at B 256 (L · N · 4H floats) and are
// allocated on every call, so fresh memory cost ~15 % of its forward + backward. PyTorch's CPU allocator
// advises huge pages only under THP_MEM_ALLOC_ENABLE=1 for the whole process and never caches; this
// allocator does both, for the tensors our kernels create and nothing else (as oneDNN's scratchpad and
// PyTorch's CUDA caching allocator do on their side).
//
// Policy: requests under 2 MiB go to PyTorch's default CPU allocator. Larger ones are rounded up to 2 MiB,
// served from the smallest cached block that fits and is at most twice the request, else allocated
// 2 MiB-aligned and advised MADV_HUGEPAGE (Linux). A freed block is cached while the cache holds at most
// STFAST_CPU_WORKSPACE_CACHE_MB MiB (default 1024; 0 disables caching), the largest blocks evicted first.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace stfast {

class CpuWorkspaceAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  // The process-wide instance (never destroyed: tensors may be freed during interpreter shutdown).
  static CpuWorkspaceAllocator& get() {
    static auto* instance = new CpuWorkspaceAllocator();
    return *instance;
  }

  c10::DataPtr allocate(size_t n) override {
    if (n < kHugePage) return c10::GetDefaultCPUAllocator()->allocate(n);
    const size_t bytes = (n + kHugePage - 1) / kHugePage * kHugePage;
    Block* b = take_cached(bytes);
    if (b == nullptr) b = new Block{fresh(bytes), bytes};
    return {b->ptr, b, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  // Returns every cached block to the system.
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, b] : cache_) destroy(b);
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  struct Block {
    void* ptr;
    size_t size;
  };

  CpuWorkspaceAllocator() {
    size_t mb = 1024;
    if (const char* env = std::getenv("STFAST_CPU_WORKSPACE_CACHE_MB"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(env, &end, 10);
      TORCH_CHECK_VALUE(*end == '\0' && env[0] != '-' && v < (1ull << 40),
                        "STFAST_CPU_WORKSPACE_CACHE_MB must be a non-negative whole number of MiB, got '", env, "'");
      mb = static_cast<size_t>(v);
    }
    limit_ = mb << 20;
  }

  static void* fresh(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, kHugePage, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, bytes, MADV_HUGEPAGE);  // advice only: where THP is off this fails and nothing changes
#endif
    return p;
  }

  static void destroy(Block* b) {
    std::free(b->ptr);
    delete b;
  }

  Block* take_cached(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.lower_bound(bytes);
    if (it == cache_.end() || it->first > 2 * bytes) return nullptr;
    Block* b = it->second;
    cache_.erase(it);
    cached_bytes_ -= b->size;
    return b;
  }

  static void release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    CpuWorkspaceAllocator& a = get();
    {
      std::lock_guard<std::mutex> lock(a.mu_);
      while (!a.cache_.empty() && a.cached_bytes_ + b->size > a.limit_) {  // evict the largest first
        auto last = std::prev(a.cache_.end());
        a.cached_bytes_ -= last->first;
        destroy(last->second);
        a.cache_.erase(last);
      }
      if (a.cached_bytes_ + b->size <= a.limit_) {
        a.cache_.emplace(b->size, b);
        a.cached_bytes_ += b->size;
        return;
      }
    }
    destroy(b);
  }

  std::mutex mu_;
  std::multimap<size_t, Block*> cache_;
  size_t cached_bytes_ = 0;
  size_t limit_ = 0;
};

// An uninitialized contiguous CPU tensor whose storage comes from CpuWorkspaceAllocator.
inline at::Tensor empty_cpu_workspace(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, &CpuWorkspaceAllocator::get(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, std::nullopt);
}

}  // namespace stfast
