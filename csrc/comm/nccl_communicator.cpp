#include "comm/nccl_communicator.h"

#include "comm/bootstrap.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>
#include <utility>

namespace stfast::comm {

namespace {

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);

ncclDataType_t nccl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: break;
  }
  TORCH_CHECK(false, "NcclCommunicator: dtype ", t, " is not supported (float32/64, float16, bfloat16, "
              "int8/32/64, uint8)");
}

ncclRedOp_t nccl_op(ReduceOp op, at::ScalarType t) {
  if (op == ReduceOp::Sum) return ncclSum;
  TORCH_CHECK(at::isFloatingType(t), "NcclCommunicator: op 'avg' needs a floating-point tensor, got ", t);
  return ncclAvg;
}

c10::DeviceIndex checked_device(int device) {
  int n = c10::cuda::device_count();
  TORCH_CHECK(device >= 0 && device < n, "NcclCommunicator: device must be in [0, ", n, "), got ", device);
  return static_cast<c10::DeviceIndex>(device);
}

}  // namespace

// ------------------------------------------------------------------------------------------ NcclWork

NcclWork::NcclWork(std::string name, uint64_t seq, std::vector<at::Tensor> tensors,
                   std::shared_ptr<CommState> state, c10::DeviceIndex device)
    : name_(std::move(name)),
      seq_(seq),
      tensors_(std::move(tensors)),
      state_(std::move(state)),
      device_(device),
      start_(std::chrono::steady_clock::now()) {}

void NcclWork::check_state() const {
  std::string err = state_->get();
  TORCH_CHECK(err.empty(), "NcclCommunicator ", name_, " #", seq_, ": ", err);
}

void NcclWork::wait() {
  check_state();
  TORCH_CHECK(recorded_, "NcclCommunicator ", name_, " #", seq_,
              ": wait() inside a group; call it after group_end()");
  c10::cuda::CUDAGuard guard(device_);
  end_.block(c10::cuda::getCurrentCUDAStream(device_));
}

bool NcclWork::is_completed() {
  check_state();
  if (!recorded_) return false;
  c10::cuda::CUDAGuard guard(device_);
  return end_.query();
}

void NcclWork::synchronize() {
  TORCH_CHECK(recorded_, "NcclCommunicator ", name_, " #", seq_,
              ": synchronize() inside a group; call it after group_end()");
  c10::cuda::CUDAGuard guard(device_);
  while (true) {
    check_state();  // the watchdog records an error (and aborts) on failure or timeout
    if (end_.query()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ---------------------------------------------------------------------------------- NcclCommunicator

NcclCommunicator::NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, int device,
                                   double timeout_s, std::string key)
    : rank_(rank),
      world_size_(world_size),
      device_(checked_device(device)),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))),
      // a high-priority pool stream, as torch's ProcessGroupNCCL may use: gradient buckets are not
      // starved by the backward's kernels
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)),
      state_(std::make_shared<CommState>()) {
  TORCH_CHECK(store, "NcclCommunicator: store must not be None");
  TORCH_CHECK(world_size >= 1, "NcclCommunicator: world_size must be >= 1, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "NcclCommunicator: rank must be in [0, ", world_size, "), got ", rank);
  TORCH_CHECK(timeout_s > 0, "NcclCommunicator: timeout must be > 0 s, got ", timeout_s);
  c10::cuda::CUDAGuard guard(device_);

  ncclUniqueId id;
  std::string mine;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    TORCH_CHECK(r == ncclSuccess, "NcclCommunicator rank 0: ncclGetUniqueId failed: ", ncclGetErrorString(r));
    mine.assign(id.internal, sizeof(id.internal));
  }
  std::string blob = exchange_through_store(*store, rank, key, mine, timeout_);
  TORCH_CHECK(blob.size() == sizeof(id.internal), "NcclCommunicator rank ", rank, ": key '", key, "' holds ",
              blob.size(), " bytes, not an ncclUniqueId (", sizeof(id.internal), " bytes)");
  std::memcpy(id.internal, blob.data(), sizeof(id.internal));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline (no host hang)
  std::lock_guard<std::mutex> lock(mu_);
  ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string msg = where() + ": ncclCommInitRankConfig failed: " + ncclGetErrorString(r);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    TORCH_CHECK(false, msg);
  }
  wait_ready_locked("ncclCommInitRankConfig (are all " + std::to_string(world_size) + " ranks running?)");
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclCommunicator::~NcclCommunicator() {
  try {
    close();
  } catch (...) {
    // close() aborted the communicator already; a destructor must not throw
    stop_watchdog();
    std::lock_guard<std::mutex> lock(mu_);
    abort_locked("destroyed after a failure");
  }
}

int NcclCommunicator::nccl_version() {
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  TORCH_CHECK(r == ncclSuccess, "ncclGetVersion failed: ", ncclGetErrorString(r));
  return v;
}

std::string NcclCommunicator::where() const {
  std::ostringstream s;
  s << "NcclCommunicator rank " << rank_ << "/" << world_size_ << " (cuda:" << static_cast<int>(device_) << ")";
  return s.str();
}

void NcclCommunicator::check_healthy_locked() const {
  std::string err = state_->get();
  TORCH_CHECK(err.empty(), where(), ": ", err);
  TORCH_CHECK(comm_ != nullptr, where(), ": communicator is closed");
}

void NcclCommunicator::abort_locked(const std::string& reason) {
  {
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->error.empty()) state_->error = reason;
  }
  if (comm_ != nullptr) {
    c10::cuda::CUDAGuard guard(device_);
    ncclCommAbort(comm_);  // its own failure cannot be acted upon: the communicator is gone either way
    comm_ = nullptr;
  }
}

void NcclCommunicator::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_locked(reason.empty() ? std::string("aborted") : reason);
}

void NcclCommunicator::fail_locked(const std::string& what, ncclResult_t r) {
  std::string msg = where() + ": " + what + " failed: " + ncclGetErrorString(r);
  if (comm_ != nullptr) {
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  }
  abort_locked(msg);
  TORCH_CHECK(false, msg);
}

void NcclCommunicator::wait_ready_locked(const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail_locked("ncclCommGetAsyncError after " + what, r);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail_locked(what, state);
    if (std::chrono::steady_clock::now() > deadline) {
      std::string msg = where() + ": " + what + " did not complete within " + std::to_string(timeout_s()) +
                        " s (timeout); communicator aborted";
      abort_locked(msg);
      TORCH_CHECK(false, msg);
    }
    std::this_thread::yield();
  }
}

void NcclCommunicator::check_locked(ncclResult_t r, const std::string& what) {
  if (r == ncclInProgress) {
    wait_ready_locked(what);
  } else if (r != ncclSuccess) {
    fail_locked(what, r);
  }
}

void NcclCommunicator::check_tensor(const at::Tensor& t, const char* op, const char* arg) const {
  TORCH_CHECK(t.defined(), "NcclCommunicator.", op, ": ", arg, " is undefined");
  TORCH_CHECK(t.is_cuda() && t.get_device() == device_, "NcclCommunicator.", op, ": ", arg,
              " must be on cuda:", static_cast<int>(device_), ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), "NcclCommunicator.", op, ": ", arg, " must be contiguous");
  TORCH_CHECK(!t.is_sparse(), "NcclCommunicator.", op, ": ", arg, " must be dense");
  nccl_dtype(t.scalar_type());
}

void NcclCommunicator::check_rank_arg(int r, const char* op, const char* arg) const {
  TORCH_CHECK(r >= 0 && r < world_size_, "NcclCommunicator.", op, ": ", arg, " must be in [0, ", world_size_,
              "), got ", r);
}

void NcclCommunicator::check_world_pair(const at::Tensor& big, const at::Tensor& small, const char* op,
                                        const char* big_arg, const char* small_arg) const {
  check_tensor(big, op, big_arg);
  check_tensor(small, op, small_arg);
  TORCH_CHECK(big.scalar_type() == small.scalar_type(), "NcclCommunicator.", op, ": ", big_arg, " dtype ",
              big.scalar_type(), " differs from ", small_arg, " dtype ", small.scalar_type());
  TORCH_CHECK(big.numel() == small.numel() * world_size_, "NcclCommunicator.", op, ": ", big_arg,
              " must hold world_size * ", small_arg, ".numel() = ", small.numel() * world_size_, " elements, got ",
              big.numel());
}

template <class Call>
std::shared_ptr<NcclWork> NcclCommunicator::enqueue(const char* name, std::vector<at::Tensor> tensors, Call&& call) {
  std::lock_guard<std::mutex> lock(mu_);
  check_healthy_locked();
  c10::cuda::CUDAGuard guard(device_);
  // join: the communicator's stream waits for the caller's stream (the inputs are ready)
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(device_));
  ready.block(stream_);
  // keep the memory: the caching allocator does not reuse it before the communicator's stream is done
  for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
  auto work = std::make_shared<NcclWork>(name, ++seq_, std::move(tensors), state_, device_);
  check_locked(call(stream_.stream()), std::string(name) + " #" + std::to_string(work->seq()));
  if (group_depth_ > 0) {
    group_works_.push_back(work);  // launched at group_end, where its end event is recorded
  } else {
    work->end_.record(stream_);
    work->recorded_ = true;
    inflight_.push_back(work);
  }
  return work;
}

std::shared_ptr<NcclWork> NcclCommunicator::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce", "tensor");
  auto dtype = nccl_dtype(tensor.scalar_type());
  auto red = nccl_op(op, tensor.scalar_type());
  return enqueue("all_reduce", {tensor}, [&](cudaStream_t s) {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, red, comm_, s);
  });
}

std::shared_ptr<NcclWork> NcclCommunicator::broadcast(const at::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "tensor");
  check_rank_arg(root, "broadcast", "root");
  auto dtype = nccl_dtype(tensor.scalar_type());
  return enqueue("broadcast", {tensor}, [&](cudaStream_t s) {
    return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, root, comm_, s);
  });
}

std::shared_ptr<NcclWork> NcclCommunicator::all_gather(const at::Tensor& output, const at::Tensor& input) {
  check_world_pair(output, input, "all_gather", "output", "input");
  auto dtype = nccl_dtype(input.scalar_type());
  return enqueue("all_gather", {output, input}, [&](cudaStream_t s) {
    return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), dtype, comm_, s);
  });
}

std::shared_ptr<NcclWork> NcclCommunicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                           ReduceOp op) {
  check_world_pair(input, output, "reduce_scatter", "input", "output");
  auto dtype = nccl_dtype(input.scalar_type());
  auto red = nccl_op(op, input.scalar_type());
  return enqueue("reduce_scatter", {output, input}, [&](cudaStream_t s) {
    return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), dtype, red, comm_, s);
  });
}

std::shared_ptr<NcclWork> NcclCommunicator::send(const at::Tensor& tensor, int peer) {
  check_tensor(tensor, "send", "tensor");
  check_rank_arg(peer, "send", "peer");
  auto dtype = nccl_dtype(tensor.scalar_type());
  return enqueue("send", {tensor}, [&](cudaStream_t s) {
    return ncclSend(tensor.data_ptr(), tensor.numel(), dtype, peer, comm_, s);
  });
}

std::shared_ptr<NcclWork> NcclCommunicator::recv(const at::Tensor& tensor, int peer) {
  check_tensor(tensor, "recv", "tensor");
  check_rank_arg(peer, "recv", "peer");
  auto dtype = nccl_dtype(tensor.scalar_type());
  return enqueue("recv", {tensor}, [&](cudaStream_t s) {
    return ncclRecv(tensor.data_ptr(), tensor.numel(), dtype, peer, comm_, s);
  });
}

void NcclCommunicator::group_start() {
  std::lock_guard<std::mutex> lock(mu_);
  check_healthy_locked();
  check_locked(ncclGroupStart(), "ncclGroupStart");
  ++group_depth_;
}

void NcclCommunicator::group_end() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(group_depth_ > 0, where(), ": group_end() without group_start()");
  check_healthy_locked();
  --group_depth_;
  c10::cuda::CUDAGuard guard(device_);
  check_locked(ncclGroupEnd(), "ncclGroupEnd");
  if (group_depth_ == 0) {
    // the grouped kernels are on the stream now: their end events go after them
    for (auto& w : group_works_) {
      w->end_.record(stream_);
      w->recorded_ = true;
      w->start_ = std::chrono::steady_clock::now();
      inflight_.push_back(w);
    }
    group_works_.clear();
  }
}

void NcclCommunicator::watchdog_loop() {
  try {
    c10::cuda::CUDAGuard guard(device_);
    while (true) {
      {
        std::unique_lock<std::mutex> s(stop_mu_);
        if (stop_cv_.wait_for(s, kWatchdogPeriod, [this] { return stop_; })) return;
      }
      std::vector<std::shared_ptr<NcclWork>> done;  // released outside the lock (tensor refs may take the GIL)
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (comm_ == nullptr) continue;
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
          ncclResult_t bad = r != ncclSuccess ? r : state;
          std::string msg = where() + ": asynchronous NCCL error: " + ncclGetErrorString(bad);
          const char* last = ncclGetLastError(comm_);
          if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
          abort_locked(msg + "; communicator aborted");
          continue;
        }
        // one stream: operations finish in order
        while (!inflight_.empty() && inflight_.front()->end_.query()) {
          done.push_back(std::move(inflight_.front()));
          inflight_.pop_front();
        }
        if (!inflight_.empty()) {
          const auto& w = inflight_.front();
          auto age = std::chrono::steady_clock::now() - w->start_;
          if (age > timeout_) {
            abort_locked(where() + ": " + w->name() + " #" + std::to_string(w->seq()) + " did not finish within " +
                         std::to_string(timeout_s()) + " s (timeout: a peer failed or is not calling it); "
                         "communicator aborted");
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    abort_locked(where() + ": watchdog failed: " + e.what());
  }
}

void NcclCommunicator::stop_watchdog() {
  {
    std::lock_guard<std::mutex> s(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void NcclCommunicator::close() {
  stop_watchdog();
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return;  // closed or aborted before
  c10::cuda::CUDAGuard guard(device_);
  // Finalize flushes the operations in flight; polled with the timeout, then the communicator is freed.
  check_locked(ncclCommFinalize(comm_), "ncclCommFinalize");
  ncclResult_t r = ncclCommDestroy(comm_);
  comm_ = nullptr;
  inflight_.clear();
  {
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->error.empty()) state_->error = "communicator is closed";
  }
  TORCH_CHECK(r == ncclSuccess, where(), ": ncclCommDestroy failed: ", ncclGetErrorString(r));
}

}  // namespace stfast::comm
