// The watchdog behind BlockingCall (runtime.hpp): one thread, started by the first call watched,
// sleeping until the earliest deadline of the calls in progress.
#include <mpiddp/comm_options.hpp>
#include <mpiddp/error.hpp>
#include <mpiddp/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace mpiddp {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStaggerPerRank = std::chrono::milliseconds(500);
constexpr int kStaggeredRanks = 10;

struct WatchedCall {
  uint64_t id = 0;
  std::string what;
  std::chrono::milliseconds timeout{};
  Clock::time_point deadline;
  int rank = -1;
  bool mpi_abort = false;  ///< MPI is initialised and lets any thread call it
};

[[noreturn]] void end_job(const std::string& what, int rank, bool mpi_abort) {
  const std::string line =
      "mpiddp: error: " + (rank >= 0 ? "[rank " + std::to_string(rank) + "] " : std::string()) + what + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  if (mpi_abort) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

[[noreturn]] void end_job(const WatchedCall& call) {
  std::ostringstream seconds;
  seconds << static_cast<double>(call.timeout.count()) / 1000.0;
  end_job(call.what + " did not complete within " + seconds.str() +
              " s (MPIDDP_COMM_TIMEOUT): a rank has stopped, hung or died, and this call cannot be interrupted, so "
              "the job ends",
          call.rank, call.mpi_abort);
}

class Watchdog {
 public:
  uint64_t watch(WatchedCall call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    call.id = ++last_id_;
    calls_.push_back(std::move(call));
    woken_.notify_one();
    return last_id_;
  }

  void unwatch(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.erase(std::remove_if(calls_.begin(), calls_.end(), [id](const WatchedCall& c) { return c.id == id; }),
                 calls_.end());
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (calls_.empty()) {
        woken_.wait(lock);
        continue;
      }
      const auto first = std::min_element(calls_.begin(), calls_.end(), [](const WatchedCall& a, const WatchedCall& b) {
        return a.deadline < b.deadline;
      });
      const auto deadline = first->deadline;  // a copy: watch() may move the calls while this waits
      if (Clock::now() < deadline) {
        woken_.wait_until(lock, deadline);
        continue;
      }
      const WatchedCall expired = *first;
      lock.unlock();
      end_job(expired);
    }
  }

  std::mutex mutex_;
  std::condition_variable woken_;
  std::vector<WatchedCall> calls_;
  uint64_t last_id_ = 0;
  bool started_ = false;
};

// Never destroyed: its thread may still wait on it while the process exits.
Watchdog& watchdog() {
  static auto* w = new Watchdog;
  return *w;
}

bool mpi_abort_allowed_from_any_thread() {
  int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) return false;
  MPI_Finalized(&finalized);
  if (finalized) return false;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

}  // namespace

BlockingCall::BlockingCall(std::string what)
    : BlockingCall(std::move(what), [] {
        static const auto timeout = CommOptions::from_environment().timeout;
        return timeout;
      }()) {}

BlockingCall::BlockingCall(std::string what, std::chrono::milliseconds timeout) {
  WatchedCall call;
  call.what = std::move(what);
  call.timeout = timeout;
  call.rank = current_rank();
  // Every waiting rank's deadline passes at about the same moment: the lower ranks' come first, so
  // that the lowest waiting rank's line is usually the job's only one (its MPI_Abort ends the rest).
  call.deadline = Clock::now() + timeout + kStaggerPerRank * std::min(std::max(call.rank, 0), kStaggeredRanks);
  call.mpi_abort = mpi_abort_allowed_from_any_thread();
  id_ = watchdog().watch(std::move(call));
}

BlockingCall::~BlockingCall() { watchdog().unwatch(id_); }

void end_job_from_watcher(const std::string& what) {
  end_job(what, current_rank(), mpi_abort_allowed_from_any_thread());
}

}  // namespace mpiddp
