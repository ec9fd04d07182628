// FakeComm: CommCore over a fake NCCL, for the CPU tests of the group / abort / close state machine
// (stfast._C._FakeComm; every build). The fake models the rules of NCCL that CommCore must keep and
// records each call and each breach of a rule ("violations"):
// - groups nest per thread; a call inside a group joins the communicator to the thread's group and is
//   queued; a failed call inside a group makes ncclGroupEnd cancel the whole group and return an error;
//   ncclGroupEnd without ncclGroupStart is invalid usage;
// - ncclCommAbort while operations are queued on the communicator in an open group frees what that
//   group refers to (a violation), as does any call on a destroyed or aborted communicator.
#pragma once

#include "comm/comm_core.h"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <string>
#include <vector>

namespace stfast::comm {

class FakeComm;

// NCCL's per-thread group state, faked.
struct FakeNcclThread {
  int depth = 0;
  bool failed = false;
  std::vector<FakeComm*> joined;  // alive: CommCore holds its group's members until the group ends
};
inline thread_local FakeNcclThread fake_nccl_thread;

class FakeWork : public WorkBase {
 public:
  // `tensors`: kept alive by the work, as NcclWork keeps its operands (the tests watch them being released)
  FakeWork(std::string name, uint64_t seq, std::shared_ptr<CommState> state, std::vector<at::Tensor> tensors)
      : WorkBase(std::move(name), seq, std::move(state)), tensors_(std::move(tensors)) {}
  void finish() { done_ = true; }  // the "GPU" reached the end event
  bool recorded() const { return recorded_; }
  int blocked() const { return blocked_; }

 protected:
  void record_end() override { recorded_ = true; }
  bool end_reached() override { return recorded_ && done_; }
  void block_caller() override { ++blocked_; }

 private:
  std::vector<at::Tensor> tensors_;
  std::atomic<bool> recorded_{false};
  std::atomic<bool> done_{false};
  std::atomic<int> blocked_{0};
};

class FakeComm : public CommCore {
 public:
  explicit FakeComm(double timeout_s)
      : CommCore("FakeComm", std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0))) {}
  ~FakeComm() override {
    try {
      close();
    } catch (...) {
      abort("destroyed after a failure");
    }
  }

  // One operation on `tensors`; `fail`: the backend rejects it (as NCCL rejects a bad argument).
  std::shared_ptr<FakeWork> op(const std::string& name, bool fail, const std::vector<at::Tensor>& tensors = {}) {
    auto w = submit([&](uint64_t seq) { return std::make_shared<FakeWork>(name, seq, state(), tensors); },
                    [&]() -> Rc {
                      touch("enqueue " + name);
                      auto& t = fake_nccl_thread;
                      if (fail) {
                        if (t.depth > 0) t.failed = true;
                        return Rc::error("invalid argument (fake)");
                      }
                      if (t.depth > 0) {
                        if (queued_in_group_++ == 0) t.joined.push_back(this);
                        return Rc::ok();
                      }
                      ++launched_;
                      return async_state_ == Rc::kInProgress ? Rc::in_progress() : Rc::ok();
                    });
    return std::static_pointer_cast<FakeWork>(w);
  }

  // What ncclCommGetAsyncError reports: "ok", "in_progress" or "error".
  void set_async(const std::string& s) {
    TORCH_CHECK(s == "ok" || s == "in_progress" || s == "error", "async must be ok, in_progress or error, got ", s);
    async_state_ = s == "ok" ? Rc::kSuccess : s == "in_progress" ? Rc::kInProgress : Rc::kError;
  }
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> g(log_mu_);
    return log_;
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> g(log_mu_);
    return violations_;
  }
  int launched() const { return launched_; }
  int cancelled() const { return cancelled_; }
  bool alive() const { return alive_; }

 protected:
  bool has_comm() const override { return alive_; }
  Rc backend_group_start() override {
    note("ncclGroupStart");
    ++fake_nccl_thread.depth;
    return Rc::ok();
  }
  Rc backend_group_end() override {
    note("ncclGroupEnd");
    auto& t = fake_nccl_thread;
    if (t.depth == 0) {
      violation("ncclGroupEnd without ncclGroupStart");
      return Rc::error("invalid usage (fake)");
    }
    if (--t.depth > 0) return Rc::ok();
    bool failed = t.failed;
    bool in_progress = false;
    for (FakeComm* c : t.joined) {
      if (!c->alive_) c->violation("ncclGroupEnd on a group holding an aborted or destroyed communicator");
      int n = c->queued_in_group_.exchange(0);
      (failed ? c->cancelled_ : c->launched_) += n;
      in_progress = in_progress || c->async_state_ == Rc::kInProgress;
    }
    t.joined.clear();
    t.failed = false;
    if (failed) return Rc::error("a call of the group failed (fake)");
    return in_progress ? Rc::in_progress() : Rc::ok();
  }
  Rc backend_async_error() override {
    touch("ncclCommGetAsyncError");
    Rc::Code s = async_state_;
    if (s == Rc::kError) return Rc::error("remote error (fake)");
    return s == Rc::kInProgress ? Rc::in_progress() : Rc::ok();
  }
  void backend_abort() override {
    touch("ncclCommAbort");
    if (queued_in_group_ > 0) violation("ncclCommAbort with operations queued in an open group");
    alive_ = false;
  }
  Rc backend_finalize() override {
    touch("ncclCommFinalize");
    return Rc::ok();
  }
  Rc backend_destroy() override {
    touch("ncclCommDestroy");
    alive_ = false;
    return Rc::ok();
  }

 private:
  void note(const std::string& s) {
    std::lock_guard<std::mutex> g(log_mu_);
    log_.push_back(s);
  }
  void violation(const std::string& s) {
    std::lock_guard<std::mutex> g(log_mu_);
    violations_.push_back(s);
  }
  // a call on the communicator itself
  void touch(const std::string& s) {
    if (!alive_) violation(s + " on an aborted or destroyed communicator");
    note(s);
  }

  std::atomic<bool> alive_{true};
  std::atomic<Rc::Code> async_state_{Rc::kSuccess};
  std::atomic<int> queued_in_group_{0};
  std::atomic<int> launched_{0};
  std::atomic<int> cancelled_{0};
  std::mutex log_mu_;
  std::vector<std::string> log_;
  std::vector<std::string> violations_;
};

}  // namespace stfast::comm
