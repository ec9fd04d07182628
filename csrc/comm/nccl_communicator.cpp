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

std::string where_of(int rank, int world_size, int device) {
  std::ostringstream s;
  s << "NcclCommunicator rank " << rank << "/" << world_size << " (cuda:" << device << ")";
  return s.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------ NcclWork

NcclWork::NcclWork(std::string name, uint64_t seq, std::vector<at::Tensor> tensors,
                   std::shared_ptr<CommState> state, c10::DeviceIndex device, c10::cuda::CUDAStream stream)
    : WorkBase(std::move(name), seq, std::move(state)), tensors_(std::move(tensors)), device_(device),
      stream_(stream) {}

void NcclWork::record_end() { end_.record(stream_); }

bool NcclWork::end_reached() {
  c10::cuda::CUDAGuard guard(device_);
  return end_.query();
}

void NcclWork::block_caller() {
  c10::cuda::CUDAGuard guard(device_);
  end_.block(c10::cuda::getCurrentCUDAStream(device_));
}

// ---------------------------------------------------------------------------------- NcclCommunicator

NcclCommunicator::NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, int device,
                                   double timeout_s, std::string key)
    : CommCore(where_of(rank, world_size, device), std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))),
      rank_(rank),
      world_size_(world_size),
      device_(checked_device(device)),
      // a high-priority pool stream, as torch's ProcessGroupNCCL may use: gradient buckets are not
      // starved by the backward's kernels
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
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
  std::string blob = exchange_through_store(
      *store, rank, key, mine, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  TORCH_CHECK(blob.size() == sizeof(id.internal), "NcclCommunicator rank ", rank, ": key '", key, "' holds ",
              blob.size(), " bytes, not an ncclUniqueId (", sizeof(id.internal), " bytes)");
  std::memcpy(id.internal, blob.data(), sizeof(id.internal));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline (no host hang)
  std::lock_guard<std::mutex> lock(mutex());
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
    // close() aborted the communicator already, or it refused (still part of an open group): a
    // destructor must not throw
    stop_watchdog();
    abort("destroyed after a failure");
  }
}

int NcclCommunicator::nccl_version() {
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  TORCH_CHECK(r == ncclSuccess, "ncclGetVersion failed: ", ncclGetErrorString(r));
  return v;
}

Rc NcclCommunicator::rc_of(ncclResult_t r) const {
  if (r == ncclSuccess) return Rc::ok();
  if (r == ncclInProgress) return Rc::in_progress();
  std::string msg = ncclGetErrorString(r);
  if (comm_ != nullptr) {
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  }
  return Rc::error(msg);
}

Rc NcclCommunicator::backend_group_start() { return rc_of(ncclGroupStart()); }

Rc NcclCommunicator::backend_group_end() {
  c10::cuda::CUDAGuard guard(device_);
  return rc_of(ncclGroupEnd());
}

Rc NcclCommunicator::backend_async_error() {
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  return rc_of(r != ncclSuccess ? r : state);
}

void NcclCommunicator::backend_abort() {
  c10::cuda::CUDAGuard guard(device_);
  ncclCommAbort(comm_);  // its own failure cannot be acted upon: the communicator is gone either way
  comm_ = nullptr;
}

Rc NcclCommunicator::backend_finalize() {
  c10::cuda::CUDAGuard guard(device_);
  return rc_of(ncclCommFinalize(comm_));
}

Rc NcclCommunicator::backend_destroy() {
  c10::cuda::CUDAGuard guard(device_);
  ncclResult_t r = ncclCommDestroy(comm_);
  comm_ = nullptr;
  return r == ncclSuccess ? Rc::ok() : Rc::error(ncclGetErrorString(r));
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
  auto w = submit(
      [&](uint64_t seq) { return std::make_shared<NcclWork>(name, seq, tensors, state(), device_, stream_); },
      [&]() {
        c10::cuda::CUDAGuard guard(device_);
        // join: the communicator's stream waits for the caller's stream (the inputs are ready)
        at::cuda::CUDAEvent ready;
        ready.record(c10::cuda::getCurrentCUDAStream(device_));
        ready.block(stream_);
        // keep the memory: the caching allocator does not reuse it before the communicator's stream is done
        for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
        return rc_of(call(stream_.stream()));
      });
  return std::static_pointer_cast<NcclWork>(w);
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

void NcclCommunicator::watchdog_loop() {
  try {
    c10::cuda::CUDAGuard guard(device_);
    while (true) {
      {
        std::unique_lock<std::mutex> s(stop_mu_);
        if (stop_cv_.wait_for(s, kWatchdogPeriod, [this] { return stop_; })) return;
      }
      watchdog_tick();  // the retired works are released here, outside the lock (tensor refs may take the GIL)
    }
  } catch (const std::exception& e) {
    abort(where() + ": watchdog failed: " + e.what());
  }
}

void NcclCommunicator::stop_watchdog() {
  {
    std::lock_guard<std::mutex> s(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
}

}  // namespace stfast::comm
