// CommCore: the state machine of a communicator's operations, grouped calls, aborts and close, without
// NCCL or CUDA. NcclCommunicator (nccl_communicator.h) implements its NCCL calls; the CPU tests drive the
// same code through a fake that models NCCL's rules (fake_comm.h), so this logic is tested in every build.
//
// NCCL's rules this code keeps (NCCL user guide: "Group Calls", "Thread Safety", ncclCommAbort):
// - ncclGroupStart/End nest per THREAD, across communicators: the depth is thread_local here, and the
//   outermost group_end launches the queued operations of every communicator the thread used in the
//   group (records their end events), whichever communicator's group_end was called.
// - ncclGroupEnd must be called for every ncclGroupStart, also after an error inside the group (an
//   operation that failed inside a group makes ncclGroupEnd cancel the whole group and return the error;
//   a group left open makes every later NCCL call of the thread, torch's too, queue and never launch).
//   group_end() calls it before it raises anything.
// - No NCCL call on a communicator from a second thread while operations are queued on it in an open
//   group, and no ncclCommAbort then (it frees the communicator the group refers to). An abort requested
//   then (watchdog timeout, abort() from another thread, an error inside the group) records the error at
//   once and runs ncclCommAbort when the group ends; the queued operations are cancelled.
// - After close() (ncclCommFinalize flushed everything, then ncclCommDestroy), finished operations
//   keep their result: wait()/is_completed() answer from their end events; only an abort or a failure
//   makes them raise.
// - After an abort the communicator drops every work it still holds (in flight or cancelled with its
//   group), releasing their tensors at once, outside its lock: ncclCommAbort ended their kernels, and the
//   caching allocator keeps the memory until the communicator's stream is done (recordStream at launch).
//   A work the caller still holds keeps its own tensors, and raises the error.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace stfast::comm {

// Result of one backend (NCCL) call.
struct Rc {
  enum Code { kSuccess, kInProgress, kError };
  Code code = kSuccess;
  std::string msg;  // kError: the backend's description
  static Rc ok() { return {}; }
  static Rc in_progress() { return {kInProgress, ""}; }
  static Rc error(std::string m) { return {kError, std::move(m)}; }
};

// The communicator's health, shared with its works (which may outlive it). Guarded by mu.
struct CommState {
  std::mutex mu;
  std::string error;  // empty while healthy; set once (abort, failure, timeout), never cleared
  bool closed = false;
};

class CommCore;

// One operation. Its phase is guarded by the shared CommState's mutex.
class WorkBase {
 public:
  enum class Phase { Queued, Launched, Cancelled };
  WorkBase(std::string name, uint64_t seq, std::shared_ptr<CommState> state);
  virtual ~WorkBase() = default;
  WorkBase(const WorkBase&) = delete;
  WorkBase& operator=(const WorkBase&) = delete;

  // Make the caller wait for the operation (CUDA: its current stream; no host synchronisation).
  // Raises the communicator's error after an abort or failure, and inside the group that queued it.
  void wait();
  // True when the operation has finished (never blocks); False while queued in an open group. Raises
  // as wait() does after an abort or failure.
  bool is_completed();
  // Block the host until the operation has finished, polling for the communicator's error (the
  // watchdog aborts after the timeout, which ends the wait with that error).
  void synchronize();
  const std::string& name() const { return name_; }
  uint64_t seq() const { return seq_; }
  Phase phase();

 protected:
  // Called once, at launch, under the communicator's lock (CUDA: record the end event on its stream).
  virtual void record_end() = 0;
  // The end has been reached (CUDA: cudaEventQuery); never blocks.
  virtual bool end_reached() = 0;
  // Make the caller wait for the end (CUDA: its current stream waits for the event).
  virtual void block_caller() = 0;

 private:
  friend class CommCore;
  // Raises the communicator's error or the cancellation; returns the phase otherwise.
  Phase checked_phase(const char* what);
  std::string name_;
  uint64_t seq_;
  std::shared_ptr<CommState> state_;
  Phase phase_ = Phase::Queued;
  std::string cancelled_;  // why it never launched
  std::chrono::steady_clock::time_point launched_at_;
};

class CommCore : public std::enable_shared_from_this<CommCore> {
 public:
  CommCore(std::string where, std::chrono::milliseconds timeout);
  virtual ~CommCore() = default;
  CommCore(const CommCore&) = delete;
  CommCore& operator=(const CommCore&) = delete;

  double timeout_s() const { return std::chrono::duration<double>(timeout_).count(); }
  // "" while healthy; the error after an abort or failure; "communicator is closed" after close().
  std::string error();
  const std::shared_ptr<CommState>& state() const { return state_; }
  const std::string& where() const { return where_; }

  // ncclGroupStart; this thread's group depth + 1. Raises (opening nothing) when unhealthy.
  void group_start();
  // ncclGroupEnd, always first; at depth 0 the queued operations of every communicator the thread used
  // in the group launch, or are cancelled (and their communicator aborted) when the group failed or an
  // abort was requested meanwhile; then raises the first error. Raises without any NCCL call when this
  // thread has no open group.
  void group_end();
  // This thread's NCCL group depth (over all communicators).
  static int thread_group_depth();

  // Abort (ncclCommAbort) and record `reason` as the error; later calls raise it. Deferred to the end of
  // the group while operations are queued on this communicator in an open group. Idempotent.
  void abort(const std::string& reason);
  // Finish the operations in flight (ncclCommFinalize) and destroy the communicator; raises on error or
  // timeout (after aborting). Raises, changing nothing, while operations are queued on it in an open
  // group. Idempotent.
  void close();
  // One watchdog round: retire finished operations, abort on an asynchronous error or an operation
  // older than the timeout (deferred as abort() is). Returns the retired works (after an abort: all it
  // held), to be released by the caller outside the lock.
  std::vector<std::shared_ptr<WorkBase>> watchdog_tick();
  // Works the communicator holds: launched and not yet retired, or queued in an open group (test hook).
  size_t held_works();

 protected:
  // Enqueue one operation: `make(seq)` builds its work, `call()` issues it (under the lock). Outside a
  // group it launches at once; inside one it is queued until the outermost group_end.
  std::shared_ptr<WorkBase> submit(const std::function<std::shared_ptr<WorkBase>(uint64_t)>& make,
                                   const std::function<Rc()>& call);
  // Wait for the last call (ncclCommGetAsyncError leaves kInProgress); abort and raise on an error or
  // after the timeout. Under the lock.
  void wait_ready_locked(const std::string& what);
  // Abort and raise `what failed: rc.msg`. Under the lock.
  [[noreturn]] void fail_locked(const std::string& what, const Rc& rc);
  // Record the error and ncclCommAbort (now, or at the end of the group holding queued operations).
  void request_abort_locked(const std::string& reason);
  std::mutex& mutex() { return mu_; }

  // The backend (NCCL). Called under mu_ except group_start/group_end, which are per thread.
  virtual bool has_comm() const = 0;  // a live communicator (not destroyed or aborted)
  virtual Rc backend_group_start() = 0;
  virtual Rc backend_group_end() = 0;
  virtual Rc backend_async_error() = 0;  // kInProgress while the last call runs, kError on failure
  virtual void backend_abort() = 0;      // ncclCommAbort; has_comm() is false after
  virtual Rc backend_finalize() = 0;
  virtual Rc backend_destroy() = 0;     // has_comm() is false after
  // Called by close() once it is allowed to proceed, before it takes the lock (stop the watchdog).
  virtual void before_close() {}

 private:
  void check_healthy_locked() const;
  // Poll the backend until the last call finished: "" or the error (no abort, no raise).
  std::string poll_ready_locked(const std::string& what);
  void abort_now_locked(const std::string& reason);
  // Release the works an abort dropped (dropped_), outside the lock: their tensor references may need
  // the GIL. Every public entry that can abort calls it on its way out (DropReleaser).
  void release_dropped();
  struct DropReleaser {
    CommCore& core;
    ~DropReleaser() { core.release_dropped(); }
  };
  void launch_locked(const std::shared_ptr<WorkBase>& w);
  // The outermost group ended with `rc`: launch or cancel the queued works. Returns the error or "".
  std::string finish_group_locked(const Rc& rc);
  bool group_open_here_locked() const { return !queued_.empty() || in_group_; }

  std::string where_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CommState> state_;
  std::mutex mu_;  // serialises backend calls on the communicator and guards the members below
  uint64_t seq_ = 0;
  std::deque<std::shared_ptr<WorkBase>> inflight_;  // launched, not yet seen finished (launch order)
  std::vector<std::shared_ptr<WorkBase>> queued_;   // in the open group of group_thread_
  std::vector<std::shared_ptr<WorkBase>> dropped_;  // given up by an abort, released by release_dropped()
  bool in_group_ = false;  // a call on it was made inside group_thread_'s open group
  bool abort_pending_ = false;
  std::thread::id group_thread_;
};

}  // namespace stfast::comm
