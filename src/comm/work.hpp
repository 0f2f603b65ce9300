// Internal: the Work every backend returns, built on polling with a deadline.
#pragma once

#include <mpiddp/comm.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace mpiddp::detail {

/// A Work whose wait() polls test() until done or until `timeout` after creation, then throws
/// CollectiveTimeout with the call's description and who_is_missing().
class PollingWork : public Work {
 public:
  /// `call` is kept to describe the collective only if it times out or fails.
  PollingWork(const ProcessGroup::Call& call, std::chrono::milliseconds timeout);
  void wait() override;

 protected:
  /// Appended to the timeout error; backends that know which ranks are late say so.
  virtual std::string who_is_missing();
  /// Called once before the timeout error is thrown (NCCL aborts its communicator here).
  virtual void on_timeout() {}
  /// For destructors: waits, and on failure reports and aborts the job (they cannot throw).
  void wait_or_abort() noexcept;

  std::string what() const { return call_.describe(); }

 private:
  ProcessGroup::Call call_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point start_;
};

/// A Work that is already complete (world of one, empty tensors).
class DoneWork : public Work {
 public:
  explicit DoneWork(std::function<void()> finish = nullptr) {
    if (finish) finish();
  }
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace mpiddp::detail
