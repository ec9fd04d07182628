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
#pragma once

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

// The communicator's error, shared with its NcclWork handles (which may outlive it).
struct CommState {
  std::mutex mu;
  std::string error;  // empty while healthy
  std::string get() {
    std::lock_guard<std::mutex> g(mu);
    return error;
  }
};

// One enqueued operation: the event recorded after it on the communicator's stream and its tensors.
class NcclWork {
 public:
  NcclWork(std::string name, uint64_t seq, std::vector<at::Tensor> tensors, std::shared_ptr<CommState> state,
           c10::DeviceIndex device);
  // Make the caller's current CUDA stream wait for this operation (no host synchronisation). Raises the
  // communicator's error if it was aborted.
  void wait();
  // True when the operation has finished on the GPU (a cudaEventQuery; never blocks).
  bool is_completed();
  // Block the host until the operation has finished, polling for the communicator's error (the
  // watchdog aborts after the timeout, which ends the wait with that error).
  void synchronize();
  const std::string& name() const { return name_; }
  uint64_t seq() const { return seq_; }

 private:
  friend class NcclCommunicator;
  void check_state() const;
  std::string name_;
  uint64_t seq_;
  std::vector<at::Tensor> tensors_;
  std::shared_ptr<CommState> state_;
  c10::DeviceIndex device_;
  at::cuda::CUDAEvent end_;
  bool recorded_ = false;  // false until the end event is recorded (inside a group: at group_end)
  std::chrono::steady_clock::time_point start_;
};

class NcclCommunicator {
 public:
  // Joins the world: rank 0 creates the ncclUniqueId and publishes it under `key` in `store`, the others
  // read it (waiting up to `timeout_s`; the error names rank and key), then ncclCommInitRankConfig on
  // CUDA device `device`. Raises c10::Error (ValueError-like messages) on bad arguments and on NCCL
  // failures or timeouts.
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, int device, double timeout_s,
                   std::string key);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  double timeout_s() const { return std::chrono::duration<double>(timeout_).count(); }
  // The communicator's error ("" while healthy; "closed" after close()).
  std::string error() const { return state_->get(); }

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
  // Grouped calls (ncclGroupStart/End): the operations between them are launched together at group_end
  // (needed for send/recv pairs between two ranks and for fusing many small collectives).
  void group_start();
  void group_end();

  // Abort: ncclCommAbort, record `reason` as the error; later calls raise it. Idempotent.
  void abort(const std::string& reason);
  // Finish the operations in flight (ncclCommFinalize), destroy the communicator; raises on error or
  // timeout (after aborting). Idempotent; the destructor calls it and aborts instead of raising.
  void close();

  // NCCL version of the linked library, e.g. 23007 for 2.30.7.
  static int nccl_version();

 private:
  template <class Call>
  std::shared_ptr<NcclWork> enqueue(const char* name, std::vector<at::Tensor> tensors, Call&& call);
  void check_tensor(const at::Tensor& t, const char* op, const char* arg) const;
  void check_rank_arg(int r, const char* op, const char* arg) const;
  // big.numel() == world_size * small.numel(), same dtype (all_gather's output, reduce_scatter's input)
  void check_world_pair(const at::Tensor& big, const at::Tensor& small, const char* op, const char* big_arg,
                        const char* small_arg) const;
  void check_healthy_locked() const;
  // Non-blocking communicator: wait until the last call has finished (ncclCommGetAsyncError leaves
  // ncclInProgress), or fail (abort + raise) on error or after the timeout.
  void wait_ready_locked(const std::string& what);
  void check_locked(ncclResult_t r, const std::string& what);
  [[noreturn]] void fail_locked(const std::string& what, ncclResult_t r);
  void abort_locked(const std::string& reason);
  void watchdog_loop();
  void stop_watchdog();
  std::string where() const;

  int rank_;
  int world_size_;
  c10::DeviceIndex device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<CommState> state_;
  uint64_t seq_ = 0;
  int group_depth_ = 0;
  std::vector<std::shared_ptr<NcclWork>> group_works_;

  std::mutex mu_;  // serialises NCCL calls on comm_ between the caller and the watchdog, and inflight_
  std::deque<std::shared_ptr<NcclWork>> inflight_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace stfast::comm
