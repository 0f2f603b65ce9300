// Internal: the Work every backend returns, built on polling with a deadline.
#pragma once

#include <mpiddp/process_group.hpp>

#include "runtime/stall.hpp"

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace mpiddp::detail {

/// What every backend's Work shares: test() polls the backend (poll()), and on completion runs
/// the backend's finishing step and releases the buffers it kept alive; wait() polls until done or
/// until `timeout` after creation, then throws CollectiveTimeout with the call's description and
/// who_is_missing(). A handle whose collective completed, failed or timed out is settled: dropping
/// it neither waits nor aborts, so a caller can catch the error. Derived destructors call settle().
class PollingWork : public Work {
 public:
  /// `call` is kept to describe the collective if it times out or fails; `keep` (scratch buffers
  /// the library reads or writes) lives until completion; `finish` runs once on completion.
  PollingWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout, std::vector<torch::Tensor> keep = {},
              std::function<void()> finish = nullptr);
  PollingWork(const PollingWork&) = delete;  // site_ describes through `this`
  PollingWork& operator=(const PollingWork&) = delete;
  bool test() final;
  void wait() final;
  void wait_on_device() final;

 protected:
  /// True once the backend's transfer is complete; throws if it failed.
  virtual bool poll() = 0;
  /// Appended to the timeout error; backends that know which ranks are late say so.
  virtual std::string who_is_missing();
  /// Called once before the timeout error is thrown (NCCL aborts its communicator here).
  virtual void on_timeout() {}
  /// wait_on_device()'s backend part: orders the device's later work after the collective and
  /// takes over watching its deadline; true when it did (the handle is then complete).
  virtual bool hand_to_device() { return false; }
  /// For destructors: waits for a collective still in flight; if that fails, reports and aborts
  /// the job (destructors cannot throw, and the buffers must not be freed under the transfer).
  void settle() noexcept;

  std::string what() const { return call_.describe(); }
  const ProcessGroup::Call& call() const { return call_; }

 private:
  void complete();  ///< the finishing step, the kept buffers released, the stall monitor told
  ProcessGroup::Call call_;
  WaitSite site_;  ///< call_ as its stall monitor knows it
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_;
  std::vector<torch::Tensor> keep_;
  std::function<void()> finish_;
  bool completed_ = false;
  std::exception_ptr failure_;  ///< set when poll(), finish or the deadline failed
};

}  // namespace mpiddp::detail
