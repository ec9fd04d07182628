#include "comm/comm_core.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace stfast::comm {

namespace {

// NCCL's group state is per thread: so is ours. The members are the communicators that received a call
// inside the open group (held alive until it ends, whose ncclGroupEnd launches their operations).
thread_local int tl_group_depth = 0;
thread_local std::vector<std::shared_ptr<CommCore>> tl_group_members;

std::string work_label(const std::string& name, uint64_t seq) {
  return "NcclCommunicator " + name + " #" + std::to_string(seq);
}

}  // namespace

// ------------------------------------------------------------------------------------------ WorkBase

WorkBase::WorkBase(std::string name, uint64_t seq, std::shared_ptr<CommState> state)
    : name_(std::move(name)), seq_(seq), state_(std::move(state)) {}

WorkBase::Phase WorkBase::phase() {
  std::lock_guard<std::mutex> g(state_->mu);
  return phase_;
}

WorkBase::Phase WorkBase::checked_phase(const char* what) {
  std::lock_guard<std::mutex> g(state_->mu);
  TORCH_CHECK(state_->error.empty(), work_label(name_, seq_), ": ", state_->error);
  TORCH_CHECK(phase_ != Phase::Cancelled, work_label(name_, seq_), ": ", cancelled_);
  TORCH_CHECK(what == nullptr || phase_ != Phase::Queued, work_label(name_, seq_), ": ", what,
              "() inside the group that queued it; call it after group_end()");
  return phase_;
}

void WorkBase::wait() {
  checked_phase("wait");
  block_caller();
}

bool WorkBase::is_completed() {
  return checked_phase(nullptr) == Phase::Launched && end_reached();
}

void WorkBase::synchronize() {
  checked_phase("synchronize");
  while (!end_reached()) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    checked_phase("synchronize");  // the watchdog records an error (and aborts) on failure or timeout
  }
}

// ---------------------------------------------------------------------------------------- CommCore

CommCore::CommCore(std::string where, std::chrono::milliseconds timeout)
    : where_(std::move(where)), timeout_(timeout), state_(std::make_shared<CommState>()) {}

int CommCore::thread_group_depth() { return tl_group_depth; }

std::string CommCore::error() {
  std::lock_guard<std::mutex> g(state_->mu);
  if (state_->error.empty() && state_->closed) return "communicator is closed";
  return state_->error;
}

void CommCore::check_healthy_locked() const {
  std::lock_guard<std::mutex> g(state_->mu);
  TORCH_CHECK(state_->error.empty(), where_, ": ", state_->error);
  TORCH_CHECK(!state_->closed && has_comm(), where_, ": communicator is closed");
}

void CommCore::abort_now_locked(const std::string& reason) {
  {
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->error.empty()) state_->error = reason;
  }
  abort_pending_ = false;
  // its own failure cannot be acted upon: the communicator is gone either way
  if (has_comm()) backend_abort();
  // no end event of theirs will be polled again (the watchdog stops at an aborted communicator)
  for (auto& w : inflight_) dropped_.push_back(std::move(w));
  inflight_.clear();
}

void CommCore::release_dropped() {
  std::vector<std::shared_ptr<WorkBase>> dropped;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  dropped.swap(dropped_);
}

size_t CommCore::held_works() {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_.size() + queued_.size() + dropped_.size();
}

void CommCore::request_abort_locked(const std::string& reason) {
  if (group_open_here_locked()) {
    // an open group refers to the communicator: record the error now (every call raises it), abort when
    // the group ends (group_end) — an ncclCommAbort now would free what ncclGroupEnd is going to use
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->error.empty()) state_->error = reason;
    abort_pending_ = true;
    return;
  }
  abort_now_locked(reason);
}

void CommCore::abort(const std::string& reason) {
  DropReleaser release{*this};
  std::lock_guard<std::mutex> lock(mu_);
  request_abort_locked(reason.empty() ? std::string("aborted") : reason);
}

void CommCore::fail_locked(const std::string& what, const Rc& rc) {
  std::string msg = where_ + ": " + what + " failed: " + rc.msg;
  request_abort_locked(msg);
  TORCH_CHECK(false, msg);
}

std::string CommCore::poll_ready_locked(const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    Rc r = backend_async_error();
    if (r.code == Rc::kSuccess) return "";
    if (r.code == Rc::kError) return where_ + ": " + what + " failed: " + r.msg;
    if (std::chrono::steady_clock::now() > deadline) {
      return where_ + ": " + what + " did not complete within " + std::to_string(timeout_s()) +
             " s (timeout); communicator aborted";
    }
    std::this_thread::yield();
  }
}

void CommCore::wait_ready_locked(const std::string& what) {
  std::string err = poll_ready_locked(what);
  if (err.empty()) return;
  request_abort_locked(err);
  TORCH_CHECK(false, err);
}

void CommCore::launch_locked(const std::shared_ptr<WorkBase>& w) {
  w->record_end();
  w->launched_at_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> g(state_->mu);
    w->phase_ = WorkBase::Phase::Launched;
  }
  inflight_.push_back(w);
}

std::shared_ptr<WorkBase> CommCore::submit(const std::function<std::shared_ptr<WorkBase>(uint64_t)>& make,
                                           const std::function<Rc()>& call) {
  const bool grouped = tl_group_depth > 0;
  DropReleaser release{*this};
  std::lock_guard<std::mutex> lock(mu_);
  check_healthy_locked();
  TORCH_CHECK(!in_group_ || group_thread_ == std::this_thread::get_id(), where_,
              ": another thread has operations queued on this communicator in its open group (NCCL allows "
              "one thread per group); call it from that thread or after its group_end()");
  std::shared_ptr<WorkBase> w = make(++seq_);
  const std::string what = w->name() + " #" + std::to_string(w->seq());
  if (grouped && !in_group_) {
    in_group_ = true;
    group_thread_ = std::this_thread::get_id();
    tl_group_members.push_back(shared_from_this());
  }
  Rc rc = call();
  if (rc.code == Rc::kError) {
    {
      std::lock_guard<std::mutex> g(state_->mu);
      w->phase_ = WorkBase::Phase::Cancelled;
      w->cancelled_ = "cancelled: " + rc.msg;
    }
    fail_locked(what, rc);  // inside a group, the abort waits for group_end
  }
  if (grouped) {
    queued_.push_back(w);  // launched by the outermost group_end, which records its end
  } else {
    if (rc.code == Rc::kInProgress) wait_ready_locked(what);
    launch_locked(w);
  }
  return w;
}

void CommCore::group_start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_healthy_locked();
  }
  Rc rc = backend_group_start();
  TORCH_CHECK(rc.code != Rc::kError, where_, ": ncclGroupStart failed: ", rc.msg);
  ++tl_group_depth;
}

std::string CommCore::finish_group_locked(const Rc& rc) {
  std::string err;
  {
    std::lock_guard<std::mutex> g(state_->mu);
    err = state_->error;  // an abort requested meanwhile, or a call that failed inside the group
  }
  if (err.empty() && rc.code == Rc::kError) err = where_ + ": ncclGroupEnd failed: " + rc.msg;
  // non-blocking communicator: the group's operations are on the streams once the state leaves
  // kInProgress; their end events must come after them
  if (err.empty() && rc.code == Rc::kInProgress) err = poll_ready_locked("ncclGroupEnd");
  std::vector<std::shared_ptr<WorkBase>> queued;
  queued.swap(queued_);
  in_group_ = false;
  group_thread_ = std::thread::id();
  if (err.empty()) {
    for (const auto& w : queued) launch_locked(w);
    return "";
  }
  {
    std::lock_guard<std::mutex> g(state_->mu);
    for (const auto& w : queued) {
      w->phase_ = WorkBase::Phase::Cancelled;
      w->cancelled_ = "cancelled with its group: " + err;
    }
  }
  for (auto& w : queued) dropped_.push_back(std::move(w));  // released outside the lock, as the others
  // the ranks' sequences of operations differ now: abort, so that the peers fail instead of hanging
  abort_now_locked(err);
  return err;
}

void CommCore::group_end() {
  TORCH_CHECK(tl_group_depth > 0, where_, ": group_end() without group_start() on this thread");
  --tl_group_depth;
  // first, whatever happened inside the group: NCCL's group of this thread must close
  Rc rc = backend_group_end();
  if (tl_group_depth > 0) {
    TORCH_CHECK(rc.code != Rc::kError, where_, ": ncclGroupEnd failed: ", rc.msg);
    return;
  }
  std::vector<std::shared_ptr<CommCore>> members;
  members.swap(tl_group_members);
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  std::string first;
  for (const auto& m : members) {
    std::lock_guard<std::mutex> lock(m->mu_);
    std::string err = m->finish_group_locked(rc);
    if (first.empty()) first = err;
  }
  if (first.empty() && rc.code == Rc::kError) first = where_ + ": ncclGroupEnd failed: " + rc.msg;
  for (const auto& m : members) m->release_dropped();
  members.clear();  // may destroy a communicator: not under its lock
  TORCH_CHECK(first.empty(), "group_end(): the group's operations were cancelled and the communicator aborted: ",
              first);
}

void CommCore::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(!group_open_here_locked(), where_,
                ": close() while the communicator is part of an open group; call it after group_end()");
  }
  before_close();
  DropReleaser release{*this};
  std::deque<std::shared_ptr<WorkBase>> retired;  // released outside the lock (tensor refs may take the GIL)
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_comm()) return;  // closed or aborted before
  // Finalize flushes the operations in flight (polled with the timeout); then the communicator is freed.
  Rc f = backend_finalize();
  if (f.code == Rc::kError) fail_locked("ncclCommFinalize", f);
  if (f.code == Rc::kInProgress) wait_ready_locked("ncclCommFinalize");
  Rc d = backend_destroy();
  retired.swap(inflight_);
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->closed = true;  // not an error: finished works keep answering from their end events
  }
  TORCH_CHECK(d.code != Rc::kError, where_, ": ncclCommDestroy failed: ", d.msg);
}

std::vector<std::shared_ptr<WorkBase>> CommCore::watchdog_tick() {
  std::vector<std::shared_ptr<WorkBase>> done;
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_comm()) {
    done.swap(dropped_);  // an abort elsewhere left them (the caller releases them outside the lock)
    return done;
  }
  // no NCCL call while an open group of another thread refers to the communicator
  if (!group_open_here_locked()) {
    Rc r = backend_async_error();
    if (r.code == Rc::kError) {
      abort_now_locked(where_ + ": asynchronous NCCL error: " + r.msg + "; communicator aborted");
      done.swap(dropped_);
      return done;
    }
  }
  while (!inflight_.empty() && inflight_.front()->end_reached()) {  // one stream: they finish in order
    done.push_back(std::move(inflight_.front()));
    inflight_.pop_front();
  }
  if (!inflight_.empty()) {
    const auto& w = inflight_.front();
    if (std::chrono::steady_clock::now() - w->launched_at_ > timeout_) {
      request_abort_locked(where_ + ": " + w->name() + " #" + std::to_string(w->seq()) + " did not finish within " +
                           std::to_string(timeout_s()) + " s (timeout: a peer failed or is not calling it); "
                           "communicator aborted");
      for (auto& d : dropped_) done.push_back(std::move(d));  // empty when the abort waits for a group
      dropped_.clear();
    }
  }
  return done;
}

}  // namespace stfast::comm
