// NcclCommunicator: a NCCL communicator of our own beside torch.distributed, bootstrapped through a
// torch.distributed Store (see bootstrap.h). Built only with CUDA + NCCL (STFAST_WITH_NCCL).
//
// Streams: every operation runs on the communicator's own CUDA stream. Before it, that stream waits
// for an event recorded on the caller's current stream (so the inputs are ready); after it, an event
// is recorded on the communicator's stream, and NcclWork::wait() makes the caller's current stream
// wait for that event. No host synchronisation anywhere on the normal path.
//
// Lifetime: the tensors of an operation are recorded on the communicator's stream with the caching
// allocator (record_stream), so their memory is not reused before the operation ends, and the
// NcclWork holds references to them.
//
// Errors: every NCCL call is checked. The communicator is non-blocking (ncclConfig_t.blocking = 0), so
// no call can hang the host: a call that returns ncclInProgress is polled with ncclCommGetAsyncError
// up to the timeout. A watchdog thread polls ncclCommGetAsyncError and the age of the operations in
// flight; on an asynchronous error or an operation older than the timeout it calls ncclCommAbort, so
// a failed rank does not hang the others. After an abort every call raises the recorded error.
//
// Groups, aborts and close follow CommCore (comm_core.h; tested on the CPU through a fake NCCL): group
// depth per thread, ncclGroupEnd always called, no ncclCommAbort while an open group holds operations
// on the communicator (deferred to the group's end), finished operations answer after close().
#pragma once

#include "comm/comm_core.h"

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace stfast::comm {

enum class ReduceOp { Sum, Avg };

// One enqueued operation: the event recorded after it on the communicator's stream and its tensors
// (wait / is_completed / synchronize: WorkBase).
class NcclWork : public WorkBase {
 public:
  NcclWork(std::string name, uint64_t seq, std::vector<at::Tensor> tensors, std::shared_ptr<CommState> state,
           c10::DeviceIndex device, c10::cuda::CUDAStream stream);

 protected:
  void record_end() override;
  bool end_reached() override;
  void block_caller() override;  // the caller's current stream waits for the end event

 private:
  std::vector<at::Tensor> tensors_;
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent end_;
};

class NcclCommunicator : public CommCore {
 public:
  // Joins the world: rank 0 creates the ncclUniqueId and publishes it under `key` in `store`, the others
  // read it (waiting up to `timeout_s`; the error names rank and key), then ncclCommInitRankConfig on
  // CUDA device `device`. Raises c10::Error (ValueError-like messages) on bad arguments and on NCCL
  // failures or timeouts.
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, int device, double timeout_s,
                   std::string key);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }

  // In place over all ranks: sum or average (float32/64, float16, bfloat16; sum also int32/int64).
  std::shared_ptr<NcclWork> all_reduce(const at::Tensor& tensor, ReduceOp op);
  // In place: every rank gets root's tensor.
  std::shared_ptr<NcclWork> broadcast(const at::Tensor& tensor, int root);
  // output (world_size * n elements) = concatenation of every rank's input (n elements), in rank order.
  std::shared_ptr<NcclWork> all_gather(const at::Tensor& output, const at::Tensor& input);
  // output (n elements) = this rank's n-element block of the reduction of every rank's input
  // (world_size * n elements).
  std::shared_ptr<NcclWork> reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op);
  // Point to point (component parallelism): the peer posts the matching recv / send.
  std::shared_ptr<NcclWork> send(const at::Tensor& tensor, int peer);
  std::shared_ptr<NcclWork> recv(const at::Tensor& tensor, int peer);
  // Grouped calls, abort, close: CommCore (group_start, group_end, abort, close).

  // NCCL version of the linked library, e.g. 23007 for 2.30.7.
  static int nccl_version();

 protected:
  bool has_comm() const override { return comm_ != nullptr; }
  Rc backend_group_start() override;
  Rc backend_group_end() override;
  Rc backend_async_error() override;
  void backend_abort() override;
  Rc backend_finalize() override;
  Rc backend_destroy() override;
  void before_close() override { stop_watchdog(); }

 private:
  template <class Call>
  std::shared_ptr<NcclWork> enqueue(const char* name, std::vector<at::Tensor> tensors, Call&& call);
  void check_tensor(const at::Tensor& t, const char* op, const char* arg) const;
  void check_rank_arg(int r, const char* op, const char* arg) const;
  // big.numel() == world_size * small.numel(), same dtype (all_gather's output, reduce_scatter's input)
  void check_world_pair(const at::Tensor& big, const at::Tensor& small, const char* op, const char* big_arg,
                        const char* small_arg) const;
  Rc rc_of(ncclResult_t r) const;
  void watchdog_loop();
  void stop_watchdog();

  int rank_;
  int world_size_;
  c10::DeviceIndex device_;
  ncclComm_t comm_ = nullptr;  // guarded by CommCore's mutex after construction
  c10::cuda::CUDAStream stream_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace stfast::comm
