// BatchPrefetcher: one reader thread, a bounded queue, errors handed to the consumer in order.
#include <mpiddp/data.hpp>
#include <mpiddp/error.hpp>

#include <pthread.h>
#include <csignal>

namespace mpiddp {

BatchPrefetcher::BatchPrefetcher(std::function<Example(int64_t)> read, int64_t count, int depth)
    : read_(std::move(read)), count_(count), depth_(depth) {
  MPIDDP_CHECK(read_ != nullptr, "BatchPrefetcher needs a read function");
  MPIDDP_CHECK(count_ >= 0 && depth_ >= 0, "BatchPrefetcher: count and depth must be >= 0");
  if (depth_ > 0 && count_ > 0) thread_ = std::thread([this] { run(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BatchPrefetcher::run() {
  // Asynchronous signals go to the training thread, whose handlers and blocking calls expect them;
  // faults raised by this thread's own code stay deliverable to it.
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  for (int64_t i = 0; i < count_; ++i) {
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < depth_; });
      if (stop_) return;
    }
    Example batch;
    std::exception_ptr error;
    try {
      std::lock_guard<std::mutex> io(io_);
      batch = read_(i);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      if (error) {
        error_ = error;
      } else {
        ready_.push_back(std::move(batch));
      }
    }
    cv_.notify_all();
    if (error) return;
  }
}

Example BatchPrefetcher::next() {
  MPIDDP_CHECK(taken_ < count_, "BatchPrefetcher: all " + std::to_string(count_) + " batches were taken");
  if (depth_ == 0) {
    std::lock_guard<std::mutex> io(io_);
    Example batch = read_(taken_);
    ++taken_;
    return batch;
  }
  Example batch;
  {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);
    batch = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_all();
  ++taken_;
  return batch;
}

}  // namespace mpiddp
